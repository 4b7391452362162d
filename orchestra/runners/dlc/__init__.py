"""The Alibaba Cloud PAI-DLC backend: one DLC job per attempt through the ``dlc`` client (docs/dlc.md)."""

from orchestra.runners.dlc.runner import AliyunConfig, DLCJob, DLCRunner, dlc_job_name, spec_digest

__all__ = ["AliyunConfig", "DLCJob", "DLCRunner", "dlc_job_name", "spec_digest"]
