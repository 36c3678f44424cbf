cd build-dev/v && tar xf vars.tar.xz && cd ../..
P=/opt/torch/.venv/bin/python3
FLASHATTN_LIBRARY=build-dev/v/head.so timeout 580 $P bench/bench_attention.py --impls ours,fa2,cudnn --rounds 6 --out $OUT/proto2.md > $OUT/proto2.log 2>&1; echo rc $?; grep "^| " $OUT/proto2.md | head -40
