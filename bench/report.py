"""The sections of BENCHMARKS.md that benches write, and nothing else of it.

Each bench that writes its results (`--write BENCHMARKS.md`) owns one section, between two
marker lines:

  <!-- NAME: written by WRITER -->
  ...what the bench wrote...
  <!-- NAME: end -->

A re-run replaces what is between its two markers and touches nothing else, so the
hand-written text around them (targets, where the time goes) survives it. If the markers
are not in the file yet, the section is added at its end. The Rust benches write theirs
the same way (bench/src/report.rs, whose test holds this list and BENCHMARKS.md to
its own); the Python ones use this module:

  sys.path.insert(0, os.path.join(ROOT, "bench")); import report
  report.check(path, "cold-pull")                  # at the start: a long run must not fail at its end
  report.write_section(path, "cold-pull", text)    # at the end

`python3 bench/report.py [BENCHMARKS.md]` checks every bench's section at once.
"""
import os
import sys

# Every section a bench writes: its name and the writer its begin marker names.
WRITERS = {
    "cold-pull": "bench/cold-pull",
    "concurrency": "bench/pull-concurrent",
    "fleet-pull": "bench/fleet-pull",
    "kruise": "bench/kruise",
    # Written by the Rust benches; named here so that `check` sees them too.
    "fleet": "rigger-bench-fleet",
    "api-load": "rigger-bench-api-load",
    "cluster-scale": "rigger-bench-cluster-scale",
}


def markers(name):
    """The begin and end marker lines of NAME's section."""
    return f"<!-- {name}: written by {WRITERS[name]} -->", f"<!-- {name}: end -->"


def _span(lines, name):
    """(begin, end) line indexes of NAME's markers, or None if the file has neither.
    Refuses a layout a rewrite would damage: a marker twice, one without the other, the
    end first, or another bench's marker between them (the inner section would be lost
    when the outer one is written again)."""
    begin, end = markers(name)
    found = [[i for i, line in enumerate(lines) if line.strip() == marker] for marker in (begin, end)]
    if not found[0] and not found[1]:
        return None
    for marker, at in zip((begin, end), found):
        if len(at) != 1:
            raise ValueError(f"{marker} is on {len(at)} lines; it must be on exactly one")
    first, last = found[0][0], found[1][0]
    if last < first:
        raise ValueError(f"{end} comes before {begin}")
    for other in WRITERS:
        if other != name:
            for marker in markers(other):
                if any(line.strip() == marker for line in lines[first + 1:last]):
                    raise ValueError(f"{marker} is inside the {name} section: move it out")
    return first, last


def _lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines(keepends=True)


def check(path, name):
    """Stop the bench now, before it measures, if NAME's section in `path` could not be
    written at its end."""
    try:
        _span(_lines(path), name)
    except ValueError as e:
        sys.exit(f"bench: {path}: {e}")


def write_section(path, name, text, heading=None):
    """Put `text` between NAME's markers in `path`. A file without them gets the section
    at its end, under `heading` if given (a section added to the end of the file must not
    read as part of the one before it)."""
    begin, end = markers(name)
    lines = _lines(path)
    body = text.strip("\n") + "\n"
    try:
        span = _span(lines, name)
    except ValueError as e:
        sys.exit(f"bench: {path}: {e}")
    if span:
        first, last = span
        updated = "".join(lines[:first + 1]) + body + "".join(lines[last:])
    else:
        head = "".join(lines).rstrip("\n")
        added = (f"{heading}\n\n" if heading else "") + f"{begin}\n{body}{end}\n"
        updated = f"{head}\n\n{added}" if head else added
    with open(path, "w") as f:
        f.write(updated)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "BENCHMARKS.md")
    lines = _lines(path)
    failed = False
    for name in WRITERS:
        try:
            span = _span(lines, name)
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            failed = True
            continue
        if span is None:
            print(f"{path}: no {name} section (its writer will add it at the end)", file=sys.stderr)
        else:
            print(f"{path}: {name}: lines {span[0] + 1}-{span[1] + 1}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
