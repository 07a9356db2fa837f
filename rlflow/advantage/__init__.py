"""The learned local advantage (Wu et al., "Learning Local Advantage Functions for
Generalizable Graph Optimizations"): how much applying a candidate (rule, site) changes a
graph's cost, predicted from the k-hop neighbourhood of its site, so that a search on an
unseen graph can try the promising candidates first and cost far fewer graphs.

- `spec`: how a trained run is named (`guided:RUN_DIR`), without torch;
- `model`: the k-hop subgraphs and the network over them (`rlflow.nn`'s shared encoder);
- `train`: `rlflow train-advantage`, supervised on the shards `rlflow collect
  --candidate-samples` writes (hence this package sits above `rlflow.worldmodel`);
- `guide`: a trained run as the ranking `rlflow.search.guided` expands candidates by.

Nothing here loads torch on import; the modules that need it load it themselves.
"""
