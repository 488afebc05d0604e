"""Words per pass of the Tofino program: the parser, the Word stages and the admission limit agree.

``build(words=N)`` compiles ``-DTOFINO_WORDS=N``.  Before, the stages w00..w15 were there for every
N, so ``bfrt.json`` counted 16 word registers and a job was admitted with up to 16 words per
packet, while the parser took at most N: a packet of N < c <= 16 words was parsed without its words
and the packet completing the cell went out with its own words as the "result".  Now the stages,
the parser states and the admission limit all follow N:

* every N, no compiler: the preprocessed source (``cpp``, the preprocessor bf-p4c runs) declares
  and applies exactly w00 .. w(N-1) and has exactly the parser states for words 0 .. N-1;
* the admission limit is read from the compiled program (:mod:`homagg.p4._compiled`): checked on
  the program before the fix, compiled for 8 words (its parser graph and its table names, kept in
  ``tests/data/tofino8_before_fix``): 16 registers, but 8 words aggregated;
* compiled (marker ``tofino``): for a spread of N by default, every supported N with
  ``HOMAGG_TOFINO_WORDS=all``: the compiled parser takes exactly c words for c <= N and none for
  c > N, there are N word registers and N + 3 stateful ALUs, and the BF Runtime entries admit a
  job of N words per packet and refuse N + 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from homagg import ConfigError
from homagg.p4 import P4_DIR, _compiled, _tofino, bfrt
from homagg.wire import P4_WORDS

from .test_tofino import _job, _switch

DATA = Path(__file__).parent / "data"
#: the words per pass each target supports (docs/p4-tofino.md: 28 fill Tofino 1's 12 stages)
SUPPORTED = {"tofino": range(1, 29), "tofino2": range(1, P4_WORDS + 1)}
#: compiled by default (15-35 s each on a 2-core VM): the ends and both sides of the old 16
DEFAULT = {"tofino": (1, 8, 16, 17), "tofino2": (16,)}


def _preprocessed(tmp: Path, words: int, target: int) -> str:
    """``homagg_tofino.p4`` through the C preprocessor (stub architecture includes), whitespace
    collapsed."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("core.p4", "tna.p4", "t2na.p4"):
        (stubs / name).write_text("")
    proc = subprocess.run(["cpp", "-P", "-undef", "-nostdinc", "-I", str(stubs), f"-D__TARGET_TOFINO__={target}",
                           f"-DTOFINO_WORDS={words}", str(P4_DIR / "tofino" / "homagg_tofino.p4")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return re.sub(r"\s+", " ", proc.stdout)


@pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor (cpp, Debian package cpp)")
@pytest.mark.parametrize("words", range(1, P4_WORDS + 1))
def test_stages_and_parser_follow_the_word_count(tmp_path: Path, words: int) -> None:
    src = _preprocessed(tmp_path, words, 2 if words > 28 else 1)
    names = [f"{i:02d}" for i in range(words)]
    assert re.findall(r"Word\(\) w(\d+);", src) == names
    assert re.findall(r"\bw(\d+)\.apply\(hdr\.words\[(\d+)\]\.value,", src) == [(n, str(i)) for i, n in enumerate(names)]
    states = re.findall(r"state parse_word_(\d+) \{ pkt\.extract\(hdr\.words\[(\d+)\]\); transition select\("
                        r"hdr\.homagg\.word_count\) \{ (\d+): accept; default: parse_word_(\d+); \} \}", src)
    assert states == [(str(i), str(i), str(i + 1), str(i + 1)) for i in range(words)]
    assert re.findall(r"state parse_word_(\d+) \{ transition accept; \}", src) == [str(words)]
    assert len(re.findall(r"\bstate parse_word_", src)) == words + 1
    assert f"1 .. {words}: parse_word_0;" in src
    # the length check still knows every count the wire allows (a count the job was not admitted
    # with is dropped as drop_word_count, as on the other targets)
    assert len(re.findall(r": lengths_consistent\(\);", src)) == P4_WORDS


def test_admission_limit_of_the_program_before_the_fix() -> None:
    """Compiled for 8 words before the fix: 16 word registers (the old limit), the parser takes 8
    and no word at all of a 9..16-word packet; the limit is now 8."""
    old = DATA / "tofino8_before_fix"
    got = _compiled.compiled_words(old)
    assert (got.parser, got.registers, got.per_pass) == (8, 16, 8)
    graph = (old / _compiled.PARSER_GRAPH).read_text()
    assert [_compiled.parser_words(graph, c) for c in range(1, 9)] == [list(range(c)) for c in range(1, 9)]
    assert all(_compiled.parser_words(graph, c) == [] for c in range(9, 17))
    assert bfrt.compiled_words(old) == 8


def test_compiled_words_needs_a_build(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="homagg p4 build"):
        bfrt.compiled_words(tmp_path)
    with pytest.raises(ConfigError, match="words per pass"):
        _tofino.build("tofino", tmp_path, words=P4_WORDS + 1)


def _word_counts() -> list[tuple[str, int]]:
    every = os.environ.get("HOMAGG_TOFINO_WORDS", "") == "all"
    return [(t, n) for t in sorted(SUPPORTED) for n in (SUPPORTED[t] if every else DEFAULT[t])]


@pytest.mark.tofino
@pytest.mark.parametrize(("target", "words"), _word_counts())
def test_compiled_program_aggregates_its_word_count(tmp_path: Path, target: str, words: int,
                                                    record_property: Callable[[str, object], None]) -> None:
    built = _tofino.build(target, tmp_path, werror=True, words=words)
    got = _compiled.compiled_words(built.out)
    assert (got.parser, got.registers, got.per_pass) == (words, words, words)
    graph = (built.out / _compiled.PARSER_GRAPH).read_text()
    for c in range(1, P4_WORDS + 1):
        assert _compiled.parser_words(graph, c) == (list(range(c)) if c <= words else []), c
    r = built.resources
    assert r.words_per_pass == words and r.stateful_alus == words + 3 and r.stages_used <= r.stages
    doc = bfrt.load_bfrt(built.bfrt)
    limit = bfrt.compiled_words(built.out)
    sw = _switch()
    assert bfrt.check_entries(doc, bfrt.job_entries(sw, _job(limit), words=limit)) > 0
    with pytest.raises(ConfigError, match="words_per_packet"):
        bfrt.job_entries(sw, _job(limit + 1), words=limit)
    record_property("homagg_report", f"{target} words={words}: " + "; ".join(r.lines()) + f"; {built.seconds:.0f} s")
