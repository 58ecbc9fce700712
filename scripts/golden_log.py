"""Golden values for trainkit::log::SummaryWriter's images and hparams, from PyTorch's own
torch.utils.tensorboard.summary: image() (its PNG decoded back with Pillow) and hparams() (the three
summaries, serialized in protobuf's deterministic order). Written by scripts/gen_golden.py."""
import io
import os

import numpy as np
import torch
from PIL import Image
from torch.utils.tensorboard.summary import hparams, image
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

# name, dataformats, shape, dtype
IMAGE_CASES = [
    ("CHW float", "CHW", (3, 4, 5), "float32"),
    ("HWC uint8", "HWC", (4, 5, 3), "uint8"),
    ("CHW one channel", "CHW", (1, 3, 4), "float32"),
    ("HW float64", "HW", (3, 4), "float64"),
    ("NCHW grid of 10", "NCHW", (10, 1, 2, 3), "float32"),
    ("NHWC uint8 grid of 3", "NHWC", (3, 2, 2, 3), "uint8"),
    ("HWC RGBA", "HWC", (2, 3, 4), "float32"),
    ("WHC transposed", "WHC", (5, 2, 3), "float32"),
]

# name, hparams (insertion order), metrics. Bools are left out: PyTorch writes them as numbers
# (isinstance(True, int)), trainkit as bools; the TensorBoard read-back test covers them.
HPARAM_CASES = [
    ("numbers and strings", [("lr", 0.001), ("optimizer", "adam"), ("batch_size", 128), ("dropout", 0.25)],
     [("hparam/accuracy", 0.91), ("hparam/loss", 0.25)]),
    ("one number no metric", [("momentum", 0.9)], []),
    ("unsorted names", [("zeta", "z"), ("alpha", 1e-7), ("mid", -3)], [("val/loss", 1.5)]),
]


def _values(shape, dtype, rng):
    n = int(np.prod(shape))
    if dtype == "uint8":
        return rng.randint(0, 256, n).astype(np.uint8).reshape(shape)
    # Outside [0, 1] on purpose: PyTorch clips after scaling by 255.
    return rng.uniform(-0.2, 1.2, n).astype(dtype).reshape(shape)


def _canonical(summary):
    """The Summary with its hparams plugin content re-serialized deterministically (map keys sorted)."""
    for value in summary.value:
        data = HParamsPluginData()
        data.ParseFromString(value.metadata.plugin_data.content)
        value.metadata.plugin_data.content = data.SerializeToString(deterministic=True)
    return summary.SerializeToString(deterministic=True).hex()


def gen_log(out_dir, header, toml_value):
    path = os.path.join(out_dir, "log.toml")
    rng = np.random.RandomState(3)
    with open(path, "w") as f:
        f.write(header)
        f.write("# torch.utils.tensorboard.summary.image(tag, x, dataformats=...): the input x (flattened, row-major)\n")
        f.write("# and the pixels of the PNG it wrote, decoded by Pillow (HWC, flattened).\n")
        for name, formats, shape, dtype in IMAGE_CASES:
            x = _values(shape, dtype, rng)
            img = image("t", torch.from_numpy(x), dataformats=formats).value[0].image
            pixels = np.asarray(Image.open(io.BytesIO(img.encoded_image_string)))
            assert pixels.shape == (img.height, img.width, img.colorspace)
            f.write("\n[[image]]\nname = {}\ndataformats = {}\nshape = {}\ndtype = {}\n".format(
                toml_value(name), toml_value(formats), toml_value(list(shape)), toml_value(dtype)))
            f.write("input = {}\n".format(toml_value([v.item() for v in x.flatten()])))
            f.write("height = {}\nwidth = {}\ncolorspace = {}\n".format(img.height, img.width, img.colorspace))
            f.write("pixels = {}\n".format(toml_value([int(v) for v in pixels.flatten()])))
        f.write("\n# torch.utils.tensorboard.summary.hparams(hparams, metrics): the serialized Summary protos (hex).\n")
        for name, hp, metrics in HPARAM_CASES:
            exp, ssi, sei = hparams(dict(hp), dict(metrics))
            f.write("\n[[hparams]]\nname = {}\n".format(toml_value(name)))
            f.write("hparam_names = {}\nhparam_values = {}\n".format(
                toml_value([k for k, _ in hp]), toml_value([v for _, v in hp])))
            f.write("metric_names = {}\nmetric_values = {}\n".format(
                toml_value([k for k, _ in metrics]), toml_value([float(v) for _, v in metrics])))
            f.write("experiment = {}\nsession_start_info = {}\nsession_end_info = {}\n".format(
                toml_value(_canonical(exp)), toml_value(_canonical(ssi)), toml_value(_canonical(sei))))
    print("wrote", path)
