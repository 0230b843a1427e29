"""Choices of ``toy_addition_mc`` laid out as the toy is trained: answer digits, then EOS up to 7 answer slots.

The toy always sees a 32-token canvas (25 prompt tokens + 7 answer slots) and infers the answer's
length from the slots it has, so a bare "1327" (4 slots, nothing after) is not what it models; the
scored continuation is therefore the whole answer region, "1327" + 3 EOS, for every choice.
"""

EOS = "<|endoftext|>"
ANSWER_SLOTS = 7


def doc_to_choice(doc: dict) -> list[str]:
    return [choice + EOS * (ANSWER_SLOTS - len(choice)) for choice in doc["choices"]]
