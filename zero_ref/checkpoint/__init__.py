"""Checkpoints: exact resume, resharding to another world size or stage, and one
plain weights file without MPI (docs/checkpoints.md).

Each rank saves its own partition of the model states, as ZeRO (Sec. 5 of the
paper) partitions them: its slice of the parameters (P_p) and of AdamW's m and v
(P_os), the same slices at every stage. So saving needs no gather and loading
no full copy; the gradients (P_g) are not state between steps and are not saved.

  manifest    the format: what a checkpoint folder holds, its JSON manifest, and
              the checks a manifest must pass (no I/O of shard data)
  reshard     pure index math: where elements [lo, hi) of a unit live in the
              files of the ranks that saved it
  writer      save: every rank writes its own slices, rank 0 the manifest; a
              save appears atomically or not at all
  space       the bytes a save needs, from the layout, checked against the
              folder's free space before the first step and before each save
  reader      open, verify (sizes, CRC-32) and read byte ranges of a checkpoint;
              a reader is an InitSource, so loading is the engine's sharded init
  to_safetensors  one safetensors file of the model's tensors, streamed (what the
              command `python -m zero_ref.app.consolidate` runs)
"""
