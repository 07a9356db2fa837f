"""Generate rewrite rules by enumerating small graphs, as TASO's generator does.

TASO (Jia et al., SOSP'19) enumerates every graph of up to a few operators over a handful of
input tensors, fingerprints each graph's outputs on random inputs, and turns graphs with equal
fingerprints into candidate substitutions, which it then prunes and verifies. This package does
the same over rlflow's op menu and writes the survivors to `rewrite/rules/generated.json`
(`rlflow rules generate`). One module a step, lowest first:

- `symbolic`: shapes whose dims are variables, and unification of the constraints ops add,
  so that a graph is valid for a whole family of shapes, its domain.
- `domain`: concrete points of a domain, the canonical one graphs are compared at and the
  three that rules are verified at.
- `menu`: the ops enumerated, and the shape rule of each.
- `dag`: ExprDag, the small graph being enumerated, and its rule-file node form.
- `exact`: exact evaluation in integer-valued float64, and the fingerprints of values.
- `enumeration`: every graph up to max_ops ops, grouped by fingerprint.
- `pairs`: candidate rules, two graphs of one group; their joint domain.
- `prune`: TASO's pruning of the pairs that follow from other rules.
- `verification`: each kept pair run in onnxruntime at three points, by the same test as
  every other rule (`rlflow.rewrite.verify.same_function`).
- `naming`: a kebab-case name that says what each rule does.
- `rulefile`: the rule-file entries and the document.
- `pipeline`: all of it per rank, ranks in parallel, then one sorted, named rule list.
- `stats`: the counts after each stage, for the report.
"""

from rlflow.rewrite.generator.menu import DEFAULT_OPS
from rlflow.rewrite.generator.pipeline import generate, write_rules
from rlflow.rewrite.generator.stats import STAGES

__all__ = ["DEFAULT_OPS", "STAGES", "generate", "write_rules"]
