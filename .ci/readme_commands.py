"""Print one of README.md's two quickstart commands exactly as written, for .ci/run.

    python3 .ci/readme_commands.py setup   # the Quickstart's command (install + first rollout)
    python3 .ci/readme_commands.py test    # the "Run the tests" command

Each is the only line of the first fenced bash block after its heading line (`## Quickstart`,
then the line starting "Run the tests"), so CI runs what a newcomer copies, never a copy of it.
"""

import sys
from pathlib import Path

ANCHORS = {"setup": "## Quickstart", "test": "Run the tests"}


def command(readme: str, which: str) -> str:
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(ANCHORS[which]))
    fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```bash")
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    body = [line for line in lines[fence + 1:end] if line.strip()]
    if len(body) != 1:
        raise SystemExit(f"README.md: the {which} block must be one command line, not {body}")
    return body[0]


if __name__ == "__main__":
    print(command((Path(__file__).parent.parent / "README.md").read_text(), sys.argv[1]))
