"""The built-in playbooks; `redline.remediation.catalog.BUILTIN_PLAYBOOKS` lists their classes.

| playbook | target label | module |
|---|---|---|
| `semantic_rollback` | `model` | `rollback` |
| `freeze_writes`, `delta_log_replay`, `freeze_and_replay` | `collection` | `index` |
| `reroute` | `region` | `reroute` |
| `spot_drain` | `node` | `spot` (options: `playbook_options.spot_drain`, `SpotDrain.Options`) |
| `rollback_candidate` | `model` | `candidate` |
| `gpu_node_failure` | `node` | `gpu` (a `spot_drain` with a cordon; `GpuNodeFailure.Options`) |
| `weights_resync` | `model` | `weights` (shards re-synced; `WeightsResync.Options`) |
| `weights_rotate` | `keyring` | `weights_rotate` (DEK rotated; `WeightsRotate.Options`) |

Each is built by its `from_settings` from a section of `RemediationSettings` (`serving`,
`rollback`, `vector_index`, `reroute`) and talks to the platform through `redline.platform`
adapters or over HTTP (`serving`), never through `redline.exporters`.
"""

from redline.remediation.playbooks.candidate import RollbackCandidate
from redline.remediation.playbooks.gpu import GpuNodeFailure
from redline.remediation.playbooks.index import DeltaLogReplay, FreezeAndReplay, FreezeWrites
from redline.remediation.playbooks.reroute import Reroute
from redline.remediation.playbooks.rollback import SemanticRollback
from redline.remediation.playbooks.spot import SpotDrain
from redline.remediation.playbooks.weights import WeightsResync
from redline.remediation.playbooks.weights_rotate import WeightsRotate

__all__ = [
    "DeltaLogReplay",
    "FreezeAndReplay",
    "FreezeWrites",
    "GpuNodeFailure",
    "Reroute",
    "RollbackCandidate",
    "SemanticRollback",
    "SpotDrain",
    "WeightsResync",
    "WeightsRotate",
]
