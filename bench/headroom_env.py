"""The virtual environment that runs headroom-ai for the side-by-side benchmark.

headroom-ai lives in its own environment, `.venv-headroom/` at the repository root, apart from the project's
`.venv`: its dependencies (litellm, tree-sitter grammars, ...) have nothing to do with contextd's.

    python3 bench/headroom_env.py      # creates it if missing, prints the path of its python

What is installed, and why it runs offline:
- `headroom-ai` at HEADROOM_VERSION. Its log, search, diff and JSON compressors are in its bundled Rust core.
- the `code` extra: tree-sitter and tree-sitter-language-pack, whose wheel bundles the grammars, for its
  CodeAwareCompressor; the `html` extra: trafilatura, for its HTMLExtractor.
- nothing for Kompress, its ML text compressor: that needs model weights from the HuggingFace Hub, so it is left
  out and headroom passes plain text through unchanged (bench/headroom_runner.py sets the offline switches).
- the tiktoken encodings headroom counts tokens with come inside litellm, one of its dependencies.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEADROOM_VERSION = "0.42.0"
REQUIREMENT = f"headroom-ai[code,html]=={HEADROOM_VERSION}"
VENV_NAME = ".venv-headroom"
# Written once the install has succeeded; holds REQUIREMENT, so a half-done install or a version change reinstalls.
_MARKER = ".installed"


def headroom_python(root: Path) -> Path:
    """The python of the headroom venv under `root`, created and installed first if missing or out of date."""
    venv = root / VENV_NAME
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    if python.exists() and marker.exists() and marker.read_text().strip() == REQUIREMENT:
        return python
    if not python.exists():
        _say(f"creating the headroom venv at {venv}")
        _run([sys.executable, "-m", "venv", str(venv)])
    _say(f"installing {REQUIREMENT} into {venv} (about a minute the first time)")
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--upgrade", "pip"])
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", REQUIREMENT])
    marker.write_text(REQUIREMENT + "\n")
    _say(f"headroom venv ready: {python}")
    return python


def _say(message: str) -> None:
    print(f"headroom_env: {message}", file=sys.stderr, flush=True)


def _run(command: list[str]) -> None:
    """Run a command with its output on stderr, so stdout stays free for the caller's data."""
    subprocess.run(command, check=True, stdout=sys.stderr)


if __name__ == "__main__":
    print(headroom_python(Path(__file__).resolve().parent.parent))
