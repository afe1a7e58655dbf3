#!/usr/bin/env python3
"""Writes the image-input test fixtures: small PNG, JPEG, WebP and GIF files, and what Pillow
and transformers' Gemma3ImageProcessor make of them.

Out (default tests/fixtures/vision/):
  images/<name>.<ext>      the test images, drawn from seeded numpy noise and gradients, written
                           by Pillow
  reference.safetensors    for each image <name>:
    decoded_<name>   uint8   [H, W, 3]   the image as Pillow opens it, then transformers'
                                         convert_to_rgb (RGB as is; anything else made RGBA and
                                         alpha-composited over white)
    pixels_<name>_<S> float32 [3, S, S]  Gemma3ImageProcessor's pixel_values at size S x S:
                                         Pillow's resize (BILINEAR) of the decoded image, then
                                         float64(x) * (1/255) cast to float32, then
                                         (x - float32(0.5)) / float32(0.5) in float32, channels
                                         first -- transformers' resize, rescale and normalize
  reference.json           Pillow's version, the images' modes and sizes, and, when transformers
                           is importable, "transformers_checked": the pixel values above equal
                           the real Gemma3ImageProcessor's (else "transformers_checked": null)

Needs numpy and Pillow (Debian: python3-numpy, python3-pil); transformers is optional.
"""

import argparse
import json
import os

import numpy as np
from PIL import Image

SIZES = (64, 100)
SEED = 77


def gradient_noise(rng, h, w, channels):
    """Smooth gradients plus noise: values that a resampler must weigh correctly."""
    y, x = np.mgrid[0:h, 0:w]
    base = [(x * 255.0 / max(w - 1, 1)), (y * 255.0 / max(h - 1, 1)), ((x + y) * 127.0 / max(w + h - 2, 1))]
    planes = []
    for c in range(channels):
        p = base[c % 3] * 0.7 + rng.integers(0, 77, size=(h, w))
        planes.append(np.clip(p, 0, 255))
    return np.stack(planes, axis=-1).astype(np.uint8)


def make_images(rng):
    """name -> (PIL image, format, save kwargs)."""
    imgs = {}
    imgs["png_rgb_64x48"] = (Image.fromarray(gradient_noise(rng, 48, 64, 3), "RGB"), "PNG", {})
    rgba = gradient_noise(rng, 60, 40, 4)
    rgba[:10, :, 3] = 0  # fully transparent rows
    rgba[10:20, :, 3] = 255
    imgs["png_rgba_40x60"] = (Image.fromarray(rgba, "RGBA"), "PNG", {})
    pal = Image.fromarray(gradient_noise(rng, 17, 33, 3), "RGB").quantize(colors=16)
    pal.info["transparency"] = 3
    imgs["png_palette_33x17"] = (pal, "PNG", {"transparency": 3})
    imgs["png_gray_50x50"] = (Image.fromarray(gradient_noise(rng, 50, 50, 1)[:, :, 0], "L"), "PNG", {})
    imgs["jpeg_rgb_120x80"] = (Image.fromarray(gradient_noise(rng, 80, 120, 3), "RGB"), "JPEG", {"quality": 90})
    imgs["jpeg_gray_31x45"] = (Image.fromarray(gradient_noise(rng, 45, 31, 1)[:, :, 0], "L"), "JPEG", {"quality": 85})
    imgs["jpeg_progressive_300x200"] = (
        Image.fromarray(gradient_noise(rng, 200, 300, 3), "RGB"),
        "JPEG",
        {"quality": 80, "progressive": True},
    )
    imgs["webp_lossy_96x64"] = (Image.fromarray(gradient_noise(rng, 64, 96, 3), "RGB"), "WEBP", {"quality": 80})
    walpha = gradient_noise(rng, 30, 45, 4)
    imgs["webp_lossless_alpha_45x30"] = (Image.fromarray(walpha, "RGBA"), "WEBP", {"lossless": True})
    gif = Image.fromarray(gradient_noise(rng, 25, 40, 3), "RGB").quantize(colors=32)
    imgs["gif_40x25"] = (gif, "GIF", {"transparency": 5})
    return imgs


EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif"}


def convert_to_rgb(image):
    """transformers.image_transforms.convert_to_rgb."""
    if image.mode == "RGB":
        return image
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def pixel_values(rgb_image, size):
    """Gemma3ImageProcessor's resize, rescale and normalize (transformers' order and dtypes)."""
    resized = np.array(rgb_image.resize((size, size), resample=Image.Resampling.BILINEAR, reducing_gap=None))
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    std = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def write_safetensors(path, tensors):
    """tensors: name -> numpy array (uint8 or float32), written in order."""
    kinds = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32"}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        blob = a.tobytes()
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)


def transformers_check(names, folder, tensors):
    """The real Gemma3ImageProcessor on each file, against pixel_values(); None without it."""
    try:
        from transformers import Gemma3ImageProcessor
    except Exception:
        return None
    worst = 0.0
    for name, ext in names.items():
        for s in SIZES:
            proc = Gemma3ImageProcessor(size={"height": s, "width": s})
            with Image.open(os.path.join(folder, f"{name}.{ext}")) as im:
                got = proc(images=im, return_tensors="np")["pixel_values"][0]
            worst = max(worst, float(np.abs(got - tensors[f"pixels_{name}_{s}"]).max()))
    return {"max_abs_diff": worst}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "vision"))
    args = ap.parse_args()
    folder = os.path.join(args.out, "images")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(SEED)
    tensors, info, names = {}, {}, {}
    for name, (im, fmt, kwargs) in make_images(rng).items():
        ext = EXT[fmt]
        path = os.path.join(folder, f"{name}.{ext}")
        im.save(path, format=fmt, **kwargs)
        names[name] = ext
        with Image.open(path) as opened:  # everything below from the file as Pillow reads it
            opened.load()
            info[name] = {"file": f"images/{name}.{ext}", "mode": opened.mode, "size": list(opened.size)}
            rgb = convert_to_rgb(opened)
        tensors[f"decoded_{name}"] = np.array(rgb, dtype=np.uint8)
        for s in SIZES:
            tensors[f"pixels_{name}_{s}"] = pixel_values(rgb, s)
    write_safetensors(os.path.join(args.out, "reference.safetensors"), tensors)
    import PIL

    report = {
        "pillow_version": PIL.__version__,
        "numpy_version": np.__version__,
        "seed": SEED,
        "sizes": list(SIZES),
        "images": info,
        "transformers_checked": transformers_check(names, folder, tensors),
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
