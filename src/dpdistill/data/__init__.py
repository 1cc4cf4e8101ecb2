"""Data sources: built-in data sets (fmnist, mnist, digits) and a user's IDX folder or .npz file."""

from dpdistill.data.base import ImageDataset, from_arrays
from dpdistill.data.sources import DatasetStatus, data_home, list_datasets, load_dataset

__all__ = ["DatasetStatus", "ImageDataset", "data_home", "from_arrays", "list_datasets", "load_dataset"]
