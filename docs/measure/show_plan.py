"""This machine's measured plan: which threads multiply each shape, per pass length (SPECDEC_HOME as for load_model)."""

from specdec.checkpoints.settings import default_models_dir
from specdec.model.fast import kernels, tuning

path = tuning.plan_file(default_models_dir())
plans = tuning.read_plan(path)
print(f"{path}: {'no plan (it is made when a model first loads)' if not plans else ''}")
print("| shape | " + " | ".join(f"m={m}" for m in kernels.M_BUCKETS) + " |")
for key, plan in sorted(plans.items()):
    print(f"| {key} | " + " | ".join(plan) + " |")
