"""progress.py: one tqdm line on stderr where someone watches (a terminal), nothing elsewhere
(a pipe, a log, --json), with the interface the commands use: Progress(total, label), .n,
.total (set later when unknown at first), .update(n, note), .write(line), .close()."""
import io

import pytest

from ffnlab import progress as P
from ffnlab.cli.main import main


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def loud():
    P.quiet(False)
    yield
    P.quiet(False)


def test_a_terminal_shows_the_label_and_the_counts():
    term = Terminal()
    bar = P.Progress(5, "calibrating", stream=term)
    for _ in range(5):
        bar.update(1, "PPL 12.5")
    bar.close()
    assert "calibrating: 5/5" in term.getvalue() and "PPL 12.5" in term.getvalue()


def test_a_pipe_shows_nothing_but_the_count_still_runs():
    """Callers advance by done - bar.n, so n counts whether the line shows or not."""
    pipe = io.StringIO()
    bar = P.Progress(5, "calibrating", stream=pipe)
    bar.update(3)
    assert bar.n == 3 and not bar.enabled
    bar.close()
    assert pipe.getvalue() == ""


def test_quiet_silences_a_terminal_too():
    P.quiet()
    term = Terminal()
    bar = P.Progress(5, "x", stream=term)
    bar.update(5)
    bar.close()
    assert term.getvalue() == ""


def test_a_total_set_later_is_shown():
    term = Terminal()
    bar = P.Progress(0, "layer 3", stream=term)
    bar.total = 4
    bar.update(4)
    bar.close()
    assert "layer 3: 4/4" in term.getvalue()


def test_write_prints_a_line_whether_or_not_the_bar_shows():
    for stream in (Terminal(), io.StringIO()):
        bar = P.Progress(2, "training", stream=stream)
        bar.write("step 1/2: train loss 3.1")
        bar.close()
        assert "step 1/2: train loss 3.1\n" in stream.getvalue()


def test_json_commands_are_quiet_and_the_next_command_is_not(tmp_path, capsys):
    """main() sets quiet() per command: --json for one command does not silence the next one."""
    from models import tiny_gguf
    path = tiny_gguf(tmp_path / "t.gguf")
    assert main(["run", "-m", path, "-p", "hi", "-n", "1", "--json"]) == 0
    assert P._quiet is True
    assert main(["run", "-m", path, "-p", "hi", "-n", "1"]) == 0
    assert P._quiet is False
