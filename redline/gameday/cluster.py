"""The experiment on the user's cluster: create the Chaos Mesh object, delete it again.

Through the Kubernetes API with `redline.platform.spot`'s client (a bearer token read on every
call; transport errors, 429 and 5xx retried). Deleting is idempotent: an object already gone (it
ended by itself, or an operator deleted it) is not an error. RBAC the game day's identity needs:
`create`, `delete` on the kind's resource in `chaos-mesh.org`, in the experiment's namespace.
"""

from __future__ import annotations

from redline.gameday.plan import PLURALS, GamedayPlan
from redline.platform.spot import KubernetesClient, KubernetesError
from redline.platform.spot.kubernetes import Access

GROUP = "chaos-mesh.org"


class ChaosMeshApi:
    """Creates and deletes a game day's experiment."""

    def __init__(self, client: KubernetesClient) -> None:
        self.client = client

    def _access(self, plan: GamedayPlan, verb: str) -> Access:
        return Access(verb, PLURALS[plan.kind], plan.name, GROUP, plan.namespace)

    def apply(self, plan: GamedayPlan) -> None:
        """Create the experiment; KubernetesError when the API refuses it (409: it exists, an
        earlier game day's left over: delete it first)."""
        self.client.request("POST", plan.path, self._access(plan, "create"), body=plan.experiment,
                            content_type="application/json")  # fmt: skip

    def remove(self, plan: GamedayPlan) -> bool:
        """Delete the experiment; False when it was already gone."""
        try:
            self.client.request("DELETE", f"{plan.path}/{plan.name}", self._access(plan, "delete"))
        except KubernetesError as exc:
            if exc.status == 404:
                return False
            raise
        return True
