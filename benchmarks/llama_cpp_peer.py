"""llama.cpp against the engine on the same weights: `wedlm bench --peer llama.cpp` under its older name.

    pip install gguf llama-cpp-python      # builds llama.cpp from source: about 10 minutes on 2 cores
    python benchmarks/llama_cpp_peer.py [wedlm bench options, e.g. --out-dir docs]

The benchmark lives in the package (`wedlm.bench.peer`, the GGUF writer in `wedlm.bench.gguf_export`);
this script passes its arguments to `wedlm bench --peer llama.cpp`.
"""

from __future__ import annotations

import sys

from wedlm.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--peer", "llama.cpp", *sys.argv[1:]]))
