"""`make gpu-check`: the first-hour script of a GPU node (docs/cluster.md#gpu-check-make-gpu-check).

    python -m lenext_dist.gpu [--dry] [--out-dir benchmarks/results/gpu] [--budget-s 480]

One module per concern:
- probe.py: is an NVIDIA device here, can torch use it (exit 1 with one line when it cannot),
  the machine and versions written into every result;
- plan.py: every case the check runs (the TinyLlama step, the attention registry sweep, long
  masks, export parity), built from the registries with shapes, the kernel each would choose and
  a memory estimate; `--dry` prints and writes this plan without a GPU;
- kernels.py: which SDPA backend ran (torch's own op names), largest allocations, the analytic
  attention-memory budget that excludes L x L;
- run_train.py, run_attention.py, run_export.py: the measurements on CUDA, one per case kind;
- report.py: one JSON + a markdown table under benchmarks/results/gpu/;
- wheelhouse.py: the wheels a node without network lacks (`make wheelhouse`);
- launch_case.py: `--launch CONFIG`, a short multi-GPU training launched as `lenext train` does, and
  one rank as a Slurm task shown only its own GPU.
"""
