"""The engine: the ZeRO stage ladder (zero_ref/engine/ladder.py: make_engine) and the
policies it plugs in. This package's __init__ imports nothing, so that importing one
module of it never runs the others.

The ladder. Each stage is a subclass of the one below it and adds
exactly one thing (Sec. 5 of the paper):

  Stage0DataParallel      baseline: full replicas, gradients all-reduced
  Stage1OptimizerSharded  + optimizer state partitioned (P_os)
  Stage2GradientsSharded  + gradients partitioned, reduce-scattered in buckets (P_os+g)
  Stage3ParamsSharded     + parameters partitioned, gathered per unit (P_os+g+p)
"""
