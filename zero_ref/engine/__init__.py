"""The engine: the ZeRO stage ladder (zero_ref/engine/ladder.py: STAGES, make_engine) and
the policies it plugs in. This package's __init__ imports nothing, so that importing one
module of it never runs the others.

The ladder is data: each stage is two parts, how a rank holds the parameters and how it
holds and reduces the gradients, and each stage swaps in the part its row of the paper
adds (Sec. 5):

  stage  params              grads                 partitions
  0      ReplicatedParams    AllReducedGrads       nothing: data parallelism
  1      ShardUpdatedParams  ReduceScatteredGrads  + optimizer state (P_os)
  2      ShardUpdatedParams  ShardedGrads          + gradients (P_os+g)
  3      GatheredParams      ShardedGrads          + parameters (P_os+g+p)

One Engine class (engine/engine.py) holds the policies and the two parts; the step every
stage runs is engine/step.py.
"""
