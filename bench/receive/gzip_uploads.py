# bench/receive: reads "round<TAB>hex" lines (COPY text), writes each upload gzip-compressed as
# COPY text of (round, bytea), as a device's --gzip-up would send it.
import gzip
import sys

for line in sys.stdin:
    number, hex_bytes = line.rstrip("\n").split("\t")
    compressed = gzip.compress(bytes.fromhex(hex_bytes), mtime=0)
    sys.stdout.write(f"{number}\t\\\\x{compressed.hex()}\n")
