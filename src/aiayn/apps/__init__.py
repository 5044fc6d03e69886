"""The users of the layers below: translate, generate, fill, quickstart, serve, the explorer.

Each user module gives its model shape its user and `aiayn` verb
(`aiayn.models.add_to_shape`); they are imported with the layer, so that whatever of
it runs knows every shape's user.
"""

from aiayn.apps import fill, generate, translate  # noqa: F401 (each adds its shape's user)
from aiayn.models import shape_spec


def verb_of(architecture: str) -> str | None:
    """The `aiayn` command that runs models of `architecture` (None: no command does).

    Raises:
        aiayn.config.plugins.UnknownPlugin: no shape of that name.
    """
    return shape_spec(architecture).verb
