"""ZeRO-Infinity's NVMe tier on a CPU machine: state in memory-mapped swap files."""
