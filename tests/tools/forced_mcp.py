"""examples/temperature_mcp.py's MCP server, serving tests/forced.py's functions: the example's two tools with every
argument an enum, so that a forced call of them ends within max_tokens whatever the model writes.

    python tests/tools/forced_mcp.py serve

The example's own code runs, with tests/forced.py as the ``temperature`` module it imports its functions from.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from tests import forced

    sys.modules["temperature"] = forced
    runpy.run_path(str(ROOT / "examples" / "temperature_mcp.py"), run_name="__main__")
