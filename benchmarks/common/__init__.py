"""Machinery the benchmark scripts share (each ``benchmarks/bench_*.py`` is one comparison).

``id_stream``: a data set's id stream with FAE's profile of other inputs of it, row-sampled so that
it can be replayed; ``cache_model``: FBGEMM's set-associative LRU and LFU caches and Belady's
replacement over that stream; ``plan_traffic``: a TorchRec ``ShardingPlan``'s UVM caches replayed
through the cache model; ``example_runs``: runs ``examples/train_dlrm_fae.py`` as its own
process(es) and reads its metrics; ``training_data``: the model a command line picks, and a profile of
its training inputs that tells which it sampled; ``arguments``: command-line values; ``allocations``: the
bytes a block of code allocates and holds at its peak, by the allocators' events.
"""
