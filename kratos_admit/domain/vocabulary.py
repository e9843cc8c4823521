"""Every label, annotation and resource name KRATOS reads or writes, in one place (DESIGN "Vocabulary")."""

from __future__ import annotations

import re
from typing import Final, Literal, get_args

GROUP: Final = "gpu.scheduler.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
PROFILE_KIND: Final = "WorkloadProfile"
PROFILE_PLURAL: Final = "workloadprofiles"

NAMESPACE_LABEL: Final = f"{GROUP}/kratos"
NAMESPACE_LABEL_VALUE: Final = "enabled"

# user vocabulary
WORKLOAD_LABEL: Final = f"{GROUP}/workload"
PROFILING_ANNOTATION: Final = f"{GROUP}/profiling"
EXECUTABLE_ANNOTATION: Final = f"{GROUP}/executable"
MIN_CC_ANNOTATION: Final = f"{GROUP}/min-compute-capability"
MIN_MEMORY_ANNOTATION: Final = f"{GROUP}/min-gpu-memory"
MAX_SLOWDOWN_ANNOTATION: Final = f"{GROUP}/max-slowdown"
PRIORITY_ANNOTATION: Final = f"{GROUP}/priority"
SCHEDULER_ANNOTATION: Final = f"{GROUP}/scheduler"
PROFILE_SKIP_ANNOTATION: Final = f"{GROUP}/profile-skip-kernels"
PROFILING_FORM_ANNOTATION: Final = f"{GROUP}/profiling-form"

# KRATOS-only vocabulary: written by the webhook or the controller, always signed
ROLE_LABEL: Final = f"{GROUP}/role"
ORIGINAL_TEMPLATE_ANNOTATION: Final = f"{GROUP}/original-template"
HINTS_ANNOTATION: Final = f"{GROUP}/hints"
PROFILE_ANNOTATION: Final = f"{GROUP}/profile"
SIGNATURE_ANNOTATION: Final = f"{GROUP}/signature"
AWAITING_PROFILE_ANNOTATION: Final = f"{GROUP}/awaiting-profile"
EXECUTION_JOB_ANNOTATION: Final = f"{GROUP}/execution-job"
RELEASE_FINALIZER: Final = f"{GROUP}/release"
PROFILE_SCHEDULING_GATE: Final = f"{GROUP}/profile"

RESERVED_LABELS: Final = frozenset({ROLE_LABEL})
RESERVED_ANNOTATIONS: Final = frozenset(
    {
        ORIGINAL_TEMPLATE_ANNOTATION,
        HINTS_ANNOTATION,
        PROFILE_ANNOTATION,
        SIGNATURE_ANNOTATION,
        AWAITING_PROFILE_ANNOTATION,
        EXECUTION_JOB_ANNOTATION,
    }
)

Priority = Literal["high", "normal", "low"]
PRIORITIES: Final = ("high", "normal", "low")
BoundType = Literal["compute", "memory", "balanced", "latency", "unknown"]
BOUND_TYPES: Final[tuple[BoundType, ...]] = get_args(BoundType)
# the units a kernel's time belongs to (DESIGN "The unit that does the work"), in the order the
# summary and the profile's status list them; and the interconnect (DESIGN "The interconnect"): the
# time a gang's GPUs spend moving data between them, which only telemetry measures
Unit = Literal["tensor", "fp32", "fp64", "memory", "interconnect", "latency"]
UNITS: Final[tuple[Unit, ...]] = get_args(Unit)
Strategy = Literal["performance", "cost", "balanced"]  # config hintStrategy, docs/ranking.md
# the two forms of the profiling rewrite (docs/profiling-forms.md): the annotation names one of them,
# config profilingForm one of them or "auto"
ProfilingForm = Literal["staged", "in-image"]
PROFILING_FORMS: Final[tuple[ProfilingForm, ...]] = get_args(ProfilingForm)
ProfilingFormSetting = Literal["auto", "staged", "in-image"]
SchedulerBackend = Literal["default", "kai", "volcano"]  # config scheduler, the scheduler annotation
SCHEDULER_BACKENDS: Final[tuple[SchedulerBackend, ...]] = get_args(SchedulerBackend)
# The API server fills these in before any webhook runs; a field holding its default counts as unset.
DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"

# NVIDIA device plugin, MIG and GPU Feature Discovery
GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GPU_CC_MAJOR_LABEL: Final = "nvidia.com/gpu.compute.major"
GPU_CC_MINOR_LABEL: Final = "nvidia.com/gpu.compute.minor"
GPU_TAINT_KEY: Final = "nvidia.com/gpu"

# Kueue (kubernetes-sigs/kueue v0.13): a Job with a queue name is Kueue's to start (it owns spec.suspend);
# the label, and the annotation Kueue still reads when the label is absent (deprecated)
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta1"
# the controllerName of KRATOS's AdmissionCheck: a follower's Workload waits (Pending) for its profile
ADMISSION_CHECK_CONTROLLER: Final = f"{GROUP}/profile"

# Gangs (DESIGN "Distributed training (gangs)"): the labels and owners by which a Job or Pod shows it
# runs with peers. JobSet v0.11 labels its child Jobs and their Pods; the Kubeflow training operator
# (and MPI operator v2) label the Pods they create; the Job controller labels an Indexed Job's Pods
# with their index (1.28: batch.kubernetes.io/job-completion-index) and every Pod with its Job's name.
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
TRAINING_JOB_NAME_LABEL: Final = "training.kubeflow.org/job-name"
# Pod labels of other systems that start Pods as one gang, each naming the gang (the pods to keep together)
GANG_POD_LABELS: Final = (
    JOBSET_NAME_LABEL,
    TRAINING_JOB_NAME_LABEL,
    "pytorch-job-name",  # the training operator before v1.0 (PyTorchJob)
    "mpi-job-name",  # MPI operator v1
    "leaderworkerset.sigs.k8s.io/name",  # LeaderWorkerSet: a leader and its workers
    "volcano.sh/job-name",  # Volcano's batch Job
    "ray.io/cluster",  # KubeRay: a head and its workers
)
# owner kinds that start their Pods (or Jobs) as a gang, and those known not to
GANG_OWNER_KINDS: Final = frozenset(
    {"JobSet", "PyTorchJob", "MPIJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob", "TrainJob"}
    | {"RayCluster", "RayJob", "LeaderWorkerSet"}
)
JOB_OWNER_KINDS_ALONE: Final = frozenset({"CronJob"})
POD_OWNER_KINDS_ALONE: Final = frozenset(
    {"Job", "ReplicaSet", "ReplicationController", "StatefulSet", "DaemonSet", "Node"}
)

# NVIDIA KAI Scheduler GPU sharing (pod annotations) and queue label
KAI_FRACTION_ANNOTATION: Final = "gpu-fraction"
KAI_MEMORY_ANNOTATION: Final = "gpu-memory"
KAI_NUM_DEVICES_ANNOTATION: Final = "gpu-fraction-num-devices"
KAI_CONTAINER_NAME_ANNOTATION: Final = "gpu-fraction-container-name"
KAI_QUEUE_LABEL: Final = "kai.scheduler/queue"
KAI_SCHEDULER_NAME: Final = "kai-scheduler"
VOLCANO_SCHEDULER_NAME: Final = "volcano"
# the KubeSchedulerConfiguration profile of webhook-config/components/scheduler-affinity
KRATOS_SCHEDULER_NAME: Final = "kratos-scheduler"

# profiling rewrite
STAGE_CONTAINER: Final = "stage-workload"
RUNNER_CONTAINER: Final = "profiling-runner"
STAGE_VOLUME: Final = "kratos-stage"
STAGE_MOUNT_PATH: Final = "/kratos/stage"
# the in-image form: stage-profiler copies the runner image's tools folder (the one-file runner and
# Nsight Compute's command-line part) into the emptyDir kratos-tools, which profiling-runner, in the
# workload's own image, mounts read-only
STAGE_PROFILER_CONTAINER: Final = "stage-profiler"
TOOLS_VOLUME: Final = "kratos-tools"
TOOLS_MOUNT_PATH: Final = "/kratos/tools"
TOOLS_IMAGE_PATH: Final = "/opt/kratos/tools"  # in the runner image (runner/Dockerfile)
TOOLS_RUNNER: Final = "kratos-runner"  # the one-file runner, relative to the tools folder
TOOLS_NCU: Final = "nsight-compute/ncu"  # Nsight Compute's CLI, relative to the tools folder

DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX: Final = 63


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and DNS1123_LABEL.match(value) is not None


def profile_name(workload: str) -> str:
    return f"{workload}-profile"


def summary_configmap_name(workload: str) -> str:
    return f"{workload}-profile-summary"


# the name of both webhook configurations webhook-config/ installs (certs inject writes their caBundle)
WEBHOOK_CONFIGURATION: Final = "kratos-admit"
