"""Golden values for trainkit::optim's layer-wise LR decay (tests/golden/layer_decay.toml), from timm itself:
timm.models.group_parameters (a model's group_matcher → layer ids) and timm.optim.param_groups_layer_decay
(layer ids → param groups with lr_scale = layer_decay^(layer_max - layer) and no weight decay for 1-D tensors
and the no_weight_decay list) on two timm models whose matchers differ: a ViT (named groups, a suffix that
merges the final norm into the last block) and a ResNet (two captured numbers per block).
Written by scripts/gen_golden.py (or alone: .venv/bin/python scripts/golden_layer_decay.py)."""
import os

import timm
from timm.models import group_parameters
from timm.optim import param_groups_layer_decay

# (model, weight_decay, layer_decay, min_scale, no_weight_decay patterns)
_CASES = [
    ("vit_tiny_patch16_224", 0.05, 0.75, 0.0, None),
    ("resnet18", 1e-4, 0.6, 0.05, ["fc.*"]),
]


def _matcher_rules(matcher):
    """timm's dict matcher as [[pattern, suffix], ...] per group, in the dict's order (its ordinals)."""
    groups = []
    for spec in matcher.values():
        if spec is None:
            groups.append([])
        elif isinstance(spec, (tuple, list)):
            groups.append([[p, [float(x) for x in (s or ())]] for p, s in spec])
        else:
            groups.append([[spec, []]])
    return groups


def _case(model_name, weight_decay, layer_decay, min_scale, no_wd):
    model = timm.create_model(model_name, pretrained=False)
    matcher = model.group_matcher(coarse=False)
    if no_wd is None:
        no_wd = sorted(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else []
    names = [n for n, _ in model.named_parameters()]
    layer_of = group_parameters(model, matcher, reverse=True)
    groups = param_groups_layer_decay(model, weight_decay=weight_decay, no_weight_decay_list=no_wd,
                                      layer_decay=layer_decay, min_scale=min_scale)
    id_to_name = {id(p): n for n, p in model.named_parameters()}
    return {
        "model": model_name,
        "weight_decay": weight_decay,
        "layer_decay": layer_decay,
        "min_scale": min_scale,
        "no_weight_decay": no_wd,
        "matcher": [[[p, s] for p, s in g] for g in _matcher_rules(matcher)],
        "names": names,
        "ndims": [p.ndim for _, p in model.named_parameters()],
        "layer_ids": [layer_of[n] for n in names],
        "group_lr_scales": [g["lr_scale"] for g in groups],
        "group_weight_decays": [g["weight_decay"] for g in groups],
        "group_params": [[id_to_name[id(p)] for p in g["params"]] for g in groups],
    }


def gen_layer_decay(out_dir, header, toml_value):
    path = os.path.join(out_dir, "layer_decay.toml")
    with open(path, "w") as f:
        f.write(header)
        f.write("# timm {}: group_parameters(model, model.group_matcher(coarse=False), reverse=True) and "
                "param_groups_layer_decay.\n".format(timm.__version__))
        for case in _CASES:
            f.write("\n[[case]]\n")
            for k, v in _case(*case).items():
                f.write("{} = {}\n".format(k, toml_value(v)))
    print("wrote", path)


if __name__ == "__main__":
    from gen_golden import HEADER, toml_value
    gen_layer_decay(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"), HEADER,
                    toml_value)
