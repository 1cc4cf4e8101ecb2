"""Defaults the command line and the Python API (dpdistill.api) share where no configuration class holds them;
free of heavy imports, so that the command line starts fast."""

TEACHER_MIN_STEPS = 300  # train-teacher: at least this many optimizer steps per teacher
PUBLIC_POOL_SIZE = 5000  # pretrain: the public images it learns from (as pate's --public-size)
FEDERATED_DELTA = 1e-5  # a federated run's delta, and the one each owner states its epsilon at unless it sets its own
