"""Stream a chat answer from ``oled-moe serve`` with the official ``openai`` client.

    oled-moe make-tiny ./tiny
    oled-moe serve --model ./tiny &
    python examples/server_client.py "Tell me about the sea."

Each chunk the server sends is one completed diffusion block; the last one carries the usage.
"""

from __future__ import annotations

import argparse
import os
import sys

from openai import OpenAI


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", nargs="?", default="Tell me about the sea.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default=os.environ.get("OLED_MOE_API_KEY", "none"),
                   help="the server's --api-key, if it has one")
    p.add_argument("--model", default=None, help="default: the model the server serves")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--block-length", type=int, default=None, help="diffusion block length (server extension)")
    args = p.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    extra = {"block_length": args.block_length} if args.block_length else None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens,
        stream=True, stream_options={"include_usage": True}, extra_body=extra,
    )
    finish, usage = None, None
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    print()
    if usage is not None:
        print(f"[{model}: {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens, "
              f"finish_reason={finish}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
