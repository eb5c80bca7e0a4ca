"""Fixed-size record benchmark: stoker vs DataLoader vs a NumPy loop vs memcpy.

    python bench/bench_fixed.py [--samples 20000] [--repeats 3] [--data DIR]

Same as `stoker bench`; see stoker/bench/records.py for what is measured.
"""

import argparse
import sys

from stoker import bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    bench.add_arguments(p)
    sys.exit(bench.main(p.parse_args()))
