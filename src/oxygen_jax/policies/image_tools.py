"""Host-side image helpers with openpi's exact pixel semantics.

The model was trained on images that openpi resized with PIL (bilinear, aspect kept, zero padding), so the
same resampler is used here: a different one (jax.image, OpenCV) shifts pixel values by a few levels.
"""

import numpy as np
from PIL import Image


def convert_to_uint8(image: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] -> uint8 by `(255 * x).astype(uint8)` (truncation, as openpi); uint8 passes."""
    image = np.asarray(image)
    if np.issubdtype(image.dtype, np.floating):
        image = (255 * image).astype(np.uint8)
    return image


def parse_image(image: np.ndarray) -> np.ndarray:
    """Robot camera image -> uint8 HWC: floats in [0, 1] become uint8, CHW (3 channels first) becomes HWC."""
    image = convert_to_uint8(image)
    if image.shape[0] == 3:
        image = np.moveaxis(image, 0, -1)
    return image


def resize_with_pad(
    images: np.ndarray, height: int, width: int, method: Image.Resampling = Image.Resampling.BILINEAR
) -> np.ndarray:
    """Resize [..., h, w, c] images to [..., height, width, c] keeping the aspect ratio, padding with zeros.

    Images already at the target size are returned unchanged (any dtype). uint8 images go through PIL's RGB
    path, bit-identical to openpi; float images are resized one channel at a time in PIL's float mode.
    """
    images = np.asarray(images)
    if images.shape[-3:-1] == (height, width):
        return images
    flat = images.reshape(-1, *images.shape[-3:])
    resized = np.stack([_resize_one(image, height, width, method) for image in flat])
    return resized.reshape(*images.shape[:-3], *resized.shape[-3:])


def _resize_one(image: np.ndarray, height: int, width: int, method: Image.Resampling) -> np.ndarray:
    """One [h, w, c] image; the target box and paste offset are computed exactly as openpi does."""
    cur_height, cur_width = image.shape[:2]
    ratio = max(cur_width / width, cur_height / height)
    resized_height = int(cur_height / ratio)
    resized_width = int(cur_width / ratio)
    top = max(0, int((height - resized_height) / 2))
    left = max(0, int((width - resized_width) / 2))
    if image.dtype == np.uint8:
        resized = np.asarray(Image.fromarray(image).resize((resized_width, resized_height), resample=method))
    else:
        channels = [
            np.asarray(Image.fromarray(channel).resize((resized_width, resized_height), resample=method))
            for channel in np.moveaxis(image.astype(np.float32), -1, 0)
        ]
        resized = np.stack(channels, axis=-1).astype(image.dtype)
    out = np.zeros((height, width, image.shape[-1]), dtype=image.dtype)
    out[top : top + resized_height, left : left + resized_width] = resized
    return out
