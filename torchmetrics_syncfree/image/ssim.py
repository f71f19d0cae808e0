"""Sync-free ``torchmetrics.image.ssim``: MultiScaleStructuralSimilarityIndexMeasure, StructuralSimilarityIndexMeasure.

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_multiscale_ssim_update``: ``torch.tensor(betas,   the same ``(len(betas), 1)`` tensor made on the device: one
device=...)``, a host-to-device copy per call        fill, plus one per exponent that differs from the most
                                                     frequent (the default five: five launches, no copy)
``MultiScaleStructuralSimilarityIndexMeasure.        ``self.total += preds.shape[0]``: a Python number, as 1.6
update`` (1.7+): ``self.total +=                     adds it
torch.tensor(preds.shape[0], device=...)``
``_ssim_update`` (both metrics): without a          ``torch.maximum`` of the same two ranges, a tensor on the
``data_range`` (the default), ``max(preds.max() -    device
preds.min(), target.max() - target.min())``: Python
``max`` reads ``b > a`` (one read per call, one per
scale in MS-SSIM)
``_ssim_update`` with ``gaussian_kernel=False``:     ``torch.full((), math.prod(kernel_size), dtype=...,
``prod(tensor(kernel_size, device=...))`` (a copy    device=...)``: the same product of small integers (exact
per call, per scale in MS-SSIM)                      in float32 below 2**24, in half below 2048), no copy
==================================================  ===========================================================

StructuralSimilarityIndexMeasure shares ``_ssim_update``: with its default ``data_range=None`` it read the images'
range on the host, with ``gaussian_kernel=False`` it copied the kernel size. ``_ssim_update`` is the layer's copy of
stock's function with these two changes, on every device. The values are stock's to the bit: the exponents are the
same values in the same dtype (``torch.tensor``'s: the default float dtype), raised with the same tensor ``pow``, the
range is the larger of the same two, the kernel's size the same number, and the count adds the same number.
Exponents that are not Python numbers (tensors, complex) take stock's path.

Documented deviation: where one image range is NaN (images holding NaN), ``torch.maximum`` gives NaN where Python's
``max`` may give the other range; the similarity of such images is NaN either way.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.functional.image import ssim as _stock_ssim
from torchmetrics.functional.image.ssim import _get_normalized_sim_and_cs, _ssim_check_inputs
from torchmetrics.functional.image.utils import _gaussian_kernel_2d, _gaussian_kernel_3d, _reflection_pad_3d

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.image import made_on_device

_FUNCTIONAL = "torchmetrics.functional.image.ssim"
_CLASS = "torchmetrics.image.ssim.MultiScaleStructuralSimilarityIndexMeasure"

#: TorchMetrics after 1.9.0 reads the default range of the images on the host (``.item()``, a sync), so stock's ``c1``
#: and ``c2`` are Python floats, squared in double precision; 1.9.0 and before keep the range a float32 tensor. Read
#: from stock's source before anything is patched (the area modules are imported first).
_STOCK_READS_THE_RANGE = ".item()" in inspect.getsource(_stock_ssim._ssim_update)


def _dtype_of(values: Sequence[Any]) -> torch.dtype | None:
    """The dtype ``torch.tensor(values)`` gives Python numbers; None for anything else."""
    if not all(isinstance(v, (bool, int, float)) for v in values):
        return None
    if any(isinstance(v, float) for v in values):
        return torch.get_default_dtype()
    return torch.bool if all(isinstance(v, bool) for v in values) else torch.int64


@replaces(
    f"{_FUNCTIONAL}._ssim_update",
    params=(
        *("preds", "target", "gaussian_kernel", "sigma", "kernel_size", "data_range", "k1", "k2"),
        *("return_full_image", "return_contrast_sensitivity"),
    ),
    everywhere=True,
)
def _ssim_update(
    preds: Tensor,
    target: Tensor,
    gaussian_kernel: bool = True,
    sigma: float | Sequence[float] = 1.5,
    kernel_size: int | Sequence[int] = 11,
    data_range: float | tuple[float, float] | Tensor | None = None,
    k1: float = 0.01,
    k2: float = 0.03,
    return_full_image: bool = False,
    return_contrast_sensitivity: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Stock's similarity; the default range by ``torch.maximum``, the uniform kernel's size made on the device."""
    is_3d = preds.ndim == 5
    if not isinstance(kernel_size, Sequence):
        kernel_size = 3 * [kernel_size] if is_3d else 2 * [kernel_size]
    if not isinstance(sigma, Sequence):
        sigma = 3 * [sigma] if is_3d else 2 * [sigma]
    if len(kernel_size) != len(target.shape) - 2:
        raise ValueError(
            f"`kernel_size` has dimension {len(kernel_size)}, but expected to be two less that target dimensionality,"
            f" which is: {len(target.shape)}"
        )
    if len(kernel_size) not in (2, 3):
        raise ValueError(
            f"Expected `kernel_size` dimension to be 2 or 3. `kernel_size` dimensionality: {len(kernel_size)}"
        )
    if len(sigma) != len(target.shape) - 2:
        raise ValueError(
            f"`kernel_size` has dimension {len(kernel_size)}, but expected to be two less that target dimensionality,"
            f" which is: {len(target.shape)}"
        )
    if len(sigma) not in (2, 3):
        raise ValueError(
            f"Expected `kernel_size` dimension to be 2 or 3. `kernel_size` dimensionality: {len(kernel_size)}"
        )
    if return_full_image and return_contrast_sensitivity:
        raise ValueError("Arguments `return_full_image` and `return_contrast_sensitivity` are mutually exclusive.")
    if any(x % 2 == 0 or x <= 0 for x in kernel_size):
        raise ValueError(f"Expected `kernel_size` to have odd positive number. Got {kernel_size}.")
    if any(y <= 0 for y in sigma):
        raise ValueError(f"Expected `sigma` to have positive number. Got {sigma}.")

    if data_range is None:
        data_range = torch.maximum(preds.max() - preds.min(), target.max() - target.min())
        if _STOCK_READS_THE_RANGE:  # stock's constants are then Python floats: double precision, as here
            data_range = data_range.double()
    elif isinstance(data_range, tuple):
        preds = torch.clamp(preds, min=data_range[0], max=data_range[1])
        target = torch.clamp(target, min=data_range[0], max=data_range[1])
        data_range = data_range[1] - data_range[0]
    c1 = (k1 * data_range) ** 2  # stock: the builtin pow (the same op), which Dynamo cannot trace on a tensor
    c2 = (k2 * data_range) ** 2
    device, channel, dtype = preds.device, preds.size(1), preds.dtype
    gauss_kernel_size = [int(3.5 * s + 0.5) * 2 + 1 for s in sigma]
    if gaussian_kernel:
        pad_h = (gauss_kernel_size[0] - 1) // 2
        pad_w = (gauss_kernel_size[1] - 1) // 2
    else:
        pad_h = (kernel_size[0] - 1) // 2
        pad_w = (kernel_size[1] - 1) // 2
    if is_3d:
        pad_d = (kernel_size[2] - 1) // 2
        preds = _reflection_pad_3d(preds, pad_d, pad_w, pad_h)
        target = _reflection_pad_3d(target, pad_d, pad_w, pad_h)
        if gaussian_kernel:
            kernel = _gaussian_kernel_3d(channel, gauss_kernel_size, sigma, dtype, device)
    else:
        preds = F.pad(preds, (pad_w, pad_w, pad_h, pad_h), mode="reflect")
        target = F.pad(target, (pad_w, pad_w, pad_h, pad_h), mode="reflect")
        if gaussian_kernel:
            kernel = _gaussian_kernel_2d(channel, gauss_kernel_size, sigma, dtype, device)
    if not gaussian_kernel:
        # stock: ``torch.prod(torch.tensor(kernel_size, dtype=dtype, device=device))``, a product of small integers
        size = torch.full((), math.prod(kernel_size), dtype=dtype, device=device)
        kernel = torch.ones((channel, 1, *kernel_size), dtype=dtype, device=device) / size

    input_list = torch.cat((preds, target, preds * preds, target * target, preds * target))  # (5 * B, C, H, W)
    outputs = F.conv3d(input_list, kernel, groups=channel) if is_3d else F.conv2d(input_list, kernel, groups=channel)
    output_list = outputs.split(preds.shape[0])
    mu_pred_sq = output_list[0].pow(2)
    mu_target_sq = output_list[1].pow(2)
    mu_pred_target = output_list[0] * output_list[1]
    sigma_pred_sq = torch.clamp(output_list[2] - mu_pred_sq, min=0.0)
    sigma_target_sq = torch.clamp(output_list[3] - mu_target_sq, min=0.0)
    sigma_pred_target = output_list[4] - mu_pred_target
    upper = 2 * sigma_pred_target.to(dtype) + c2
    lower = (sigma_pred_sq + sigma_target_sq).to(dtype) + c2
    ssim_idx_full_image = ((2 * mu_pred_target + c1) * upper) / ((mu_pred_sq + mu_target_sq + c1) * lower)
    per_image = ssim_idx_full_image.reshape(ssim_idx_full_image.shape[0], -1).mean(-1)
    if return_contrast_sensitivity:
        contrast_sensitivity = upper / lower
        if is_3d:
            contrast_sensitivity = contrast_sensitivity[..., pad_h:-pad_h, pad_w:-pad_w, pad_d:-pad_d]
        else:
            contrast_sensitivity = contrast_sensitivity[..., pad_h:-pad_h, pad_w:-pad_w]
        return per_image, contrast_sensitivity.reshape(contrast_sensitivity.shape[0], -1).mean(-1)
    if return_full_image:
        return per_image, ssim_idx_full_image
    return per_image


@replaces(
    f"{_FUNCTIONAL}._multiscale_ssim_update",
    params=(
        *("preds", "target", "gaussian_kernel", "sigma", "kernel_size"),
        *("data_range", "k1", "k2", "betas", "normalize"),
    ),
    everywhere=True,
)
def _multiscale_ssim_update(
    preds: Tensor,
    target: Tensor,
    gaussian_kernel: bool = True,
    sigma: float | Sequence[float] = 1.5,
    kernel_size: int | Sequence[int] = 11,
    data_range: float | tuple[float, float] | None = None,
    k1: float = 0.01,
    k2: float = 0.03,
    betas: tuple[float, ...] = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333),
    normalize: str | None = None,
) -> Tensor:
    """Stock's multi-scale similarity; the exponents made on the device instead of copied there."""
    dtype = _dtype_of(betas) if isinstance(betas, Sequence) else None
    if dtype is None or not betas:
        return stock(f"{_FUNCTIONAL}._multiscale_ssim_update")(
            preds, target, gaussian_kernel, sigma, kernel_size, data_range, k1, k2, betas, normalize
        )
    mcs_list: list[Tensor] = []
    is_3d = preds.ndim == 5
    if not isinstance(kernel_size, Sequence):
        kernel_size = 3 * [kernel_size] if is_3d else 2 * [kernel_size]
    if not isinstance(sigma, Sequence):
        sigma = 3 * [sigma] if is_3d else 2 * [sigma]

    if preds.size()[-1] < 2 ** len(betas) or preds.size()[-2] < 2 ** len(betas):
        raise ValueError(
            f"For a given number of `betas` parameters {len(betas)}, the image height and width dimensions must be"
            f" larger than or equal to {2 ** len(betas)}."
        )
    _betas_div = max(1, (len(betas) - 1)) ** 2
    if preds.size()[-2] // _betas_div <= kernel_size[0] - 1:
        raise ValueError(
            f"For a given number of `betas` parameters {len(betas)} and kernel size {kernel_size[0]},"
            f" the image height must be larger than {(kernel_size[0] - 1) * _betas_div}."
        )
    if preds.size()[-1] // _betas_div <= kernel_size[1] - 1:
        raise ValueError(
            f"For a given number of `betas` parameters {len(betas)} and kernel size {kernel_size[1]},"
            f" the image width must be larger than {(kernel_size[1] - 1) * _betas_div}."
        )

    for _ in range(len(betas)):
        sim, contrast_sensitivity = _get_normalized_sim_and_cs(
            preds, target, gaussian_kernel, sigma, kernel_size, data_range, k1, k2, normalize=normalize
        )
        mcs_list.append(contrast_sensitivity)
        if len(kernel_size) == 2:
            preds = F.avg_pool2d(preds, (2, 2))
            target = F.avg_pool2d(target, (2, 2))
        elif len(kernel_size) == 3:
            preds = F.avg_pool3d(preds, (2, 2, 2))
            target = F.avg_pool3d(target, (2, 2, 2))
        else:
            raise ValueError("length of kernel_size is neither 2 nor 3")

    mcs_list[-1] = sim
    mcs_stack = torch.stack(mcs_list)
    if normalize == "simple":
        mcs_stack = (mcs_stack + 1) / 2
    exponents = made_on_device(betas, (len(betas), 1), dtype, mcs_stack.device)
    return torch.prod(mcs_stack**exponents, axis=0)  # type: ignore[call-overload]


@replaces(f"{_CLASS}.update", params=("self", "preds", "target"), kind="metric_method")
def _ms_ssim_update(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's update; the image count added as a Python number, not copied to the device."""
    preds, target = _ssim_check_inputs(preds, target)
    similarity = _multiscale_ssim_update(
        preds,
        target,
        self.gaussian_kernel,
        self.sigma,
        self.kernel_size,
        self.data_range,
        self.k1,
        self.k2,
        self.betas,
        self.normalize,
    )
    if self.reduction in ("none", None):
        if not isinstance(self.similarity, list):
            raise TypeError("Expected `self.similarity` to be a list for reduction='none'.")
        self.similarity.append(similarity)
    else:
        if not isinstance(self.similarity, Tensor):
            raise TypeError("Expected `self.similarity` to be a Tensor for elementwise_mean or sum reduction.")
        self.similarity += similarity.sum()
    if not isinstance(self.total, Tensor):
        raise TypeError("Expected `self.total` to be a Tensor.")
    self.total += preds.shape[0]
    return None
