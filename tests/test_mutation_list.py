"""The mutation check's list cannot rot silently: every sabotage's line occurs exactly once in its file, every test
it names exists, and a sabotaged file is put back byte for byte however its run ends. (`make test-mutations` runs
the sabotages themselves; this file only keeps the list true to the tree.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, CollectedSuite, load_script

mutation_check = load_script("mutation_check")
ENTRIES = mutation_check.load()


def test_the_list_names_thirteen_distinct_sabotages_of_the_judge_the_sandbox_and_the_queue() -> None:
    assert len(ENTRIES) == 13 and len({s.name for s in ENTRIES}) == 13
    folders = {str(Path(s.file).parent) for s in ENTRIES}
    assert folders == {"tools/judge", "tools/sandbox", "tools/runner", "storage"}, folders


@pytest.mark.parametrize("sabotage", ENTRIES, ids=[s.name for s in ENTRIES])
def test_each_sabotage_line_occurs_once_and_changes_it(sabotage) -> None:
    text = (REPO / sabotage.file).read_text()
    changed = mutation_check.sabotaged_text(text, sabotage)  # StaleEntry, naming the entry, if the line moved

    assert changed != text and len(changed.splitlines()) == len(text.splitlines())


def test_every_named_test_exists(collected_suite: CollectedSuite) -> None:
    named = {node for s in ENTRIES for node in s.tests}

    assert named <= collected_suite.node_ids, sorted(named - collected_suite.node_ids)


def test_a_line_that_moved_is_named_stale_and_nothing_is_written(tmp_path: Path) -> None:
    source = tmp_path / "guarded.py"
    source.write_text("def allowed(x):\n    return x > 0\n\n\ndef also_allowed(x):\n    return x > 0\n")
    twice = mutation_check.Sabotage(
        name="twice", file="guarded.py", original="return x > 0", replacement="return True", why="w", tests=["t"]
    )
    gone = twice.model_copy(update={"name": "gone", "original": "return x >= 0"})
    before = source.read_bytes()

    for entry, count in ((twice, 2), (gone, 0)):
        with pytest.raises(mutation_check.StaleEntry, match=f"{entry.name}: its line occurs {count} times"):
            with mutation_check.applied(entry, root=tmp_path):
                pass
    assert source.read_bytes() == before


def test_the_file_is_restored_byte_for_byte_when_the_run_is_interrupted(tmp_path: Path) -> None:
    source = tmp_path / "guarded.py"
    source.write_bytes(b"def allowed(x):\r\n\treturn x > 0\r\n")  # tabs and CRLF, as a restore must keep them
    before = source.read_bytes()
    entry = mutation_check.Sabotage(
        name="always", file="guarded.py", original="return x > 0", replacement="return True", why="w", tests=["t"]
    )

    with pytest.raises(KeyboardInterrupt), mutation_check.applied(entry, root=tmp_path):
        assert source.read_bytes() == b"def allowed(x):\r\n\treturn True\r\n"
        raise KeyboardInterrupt
    assert source.read_bytes() == before
