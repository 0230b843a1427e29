"""An output folder under an unknown user's home (``~nouser/x``) is one line, exit 2, not a RuntimeError traceback."""

import pytest

from oled_hf.checkpoints.output_folder import check_output_folder
from oled_hf.cli.main import main
from oled_hf.toy import TOY_CHECKPOINT

NOUSER = "~oled_no_such_user_4711/x"


def test_check_output_folder_names_the_argument():
    with pytest.raises(ValueError, match=r"^OUT ~oled_no_such_user_4711/x: no such folder \(~oled_no_such_user_4711 "
                                         r"cannot be expanded: there is no user 'oled_no_such_user_4711'"):
        check_output_folder(NOUSER, overwrite=False)


@pytest.mark.parametrize("argv", [["make-tiny", NOUSER], ["prepare", str(TOY_CHECKPOINT), NOUSER]])
def test_the_commands_print_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Could not determine home directory" not in err
    assert f"OUT {NOUSER}: no such folder" in err
