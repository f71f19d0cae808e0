"""Sync-free ``torchmetrics.nominal``, one module per upstream module it patches (each its own area).

* :mod:`~torchmetrics_syncfree.nominal.cramers` (area ``cramers``): CramersV's update and compute;
* :mod:`~torchmetrics_syncfree.nominal.tschuprows` (area ``tschuprows``): TschuprowsT's;
* :mod:`~torchmetrics_syncfree.nominal.pearson` (area ``pearsons_contingency``): PearsonsContingencyCoefficient's;
* :mod:`~torchmetrics_syncfree.nominal.theils_u` (area ``theils_u``): TheilsU's;
* :mod:`~torchmetrics_syncfree.nominal.utils`: what they share (the contingency counting and the fixed-shape
  chi-squared), as upstream's ``torchmetrics.functional.nominal.utils``.

FleissKappa reads nothing (its update is a reshape of counts, its compute tensor arithmetic): not patched.
Details: ``docs/nominal.md``.

The areas' modules are imported by :func:`torchmetrics_syncfree.patch_all` when they are patched.
"""
