"""One way to add a plug-in of any kind: attention kernels, position schemes, model shapes
and training tasks.

Each kind has one `Registry`, owned by the package its built-in plug-ins live in:

    kind              registry                               package (one module per plug-in)
    attention kernel  `aiayn.nn.kernels.KERNELS`             aiayn/nn/kernels/
    position scheme   `aiayn.nn.positions.POSITIONS`         aiayn/nn/positions/
    model shape       `aiayn.models.SHAPES`                  aiayn/models/
    training task     `aiayn.training.tasks.TASKS`           aiayn/training/tasks/

A plug-in registers itself with the registry's decorator, in its own module:

    from aiayn.nn.kernels import KERNELS, Kernel

    @KERNELS.register("my_kernel")
    class MyKernel(Kernel): ...

and nothing else names it. The first time a registry is asked for a name, it imports
every module of its package (so a new file there is found without a hand-kept list),
then the plug-ins that installed packages declare as entry points in the registry's
group (`aiayn.kernels`, `aiayn.positions`, `aiayn.shapes`, `aiayn.tasks`). In a
third-party package's pyproject.toml:

    [project.entry-points."aiayn.kernels"]
    my_kernel = "my_package.my_kernel"     # a module that registers itself when imported

An entry point may also name the plug-in object itself (`"my_package.kernels:MyKernel"`);
it is then registered under the entry point's name. An unknown name is refused with
the names that are registered; nothing falls back to another plug-in.

A plug-in takes its own settings from its section of the configuration
(`ModelConfig.attention_options`, `ModelConfig.position_options`, a recipe's
`data.task_options`): it declares their names (a class's `options` attribute, or
`register(name, options=(...))` for a factory function) and receives them as keyword
arguments, kernels as position schemes and tasks; `Registry.options` refuses a name the
plug-in does not declare, and the plug-in checks the values.

A configuration names its plug-ins by setting ("ModelConfig.attention"); `check_choice`
checks a name (and its options' names) with the registry that owns the setting, when
the configuration is made, so that a misspelled name is refused there. A plug-in
package that fails to import is skipped with a warning, and named, with its error, in
the refusal of any name that is not registered.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownPlugin(ValueError):
    """A name that no plug-in of its kind is registered under."""


_BY_SETTING: dict[str, Registry[Any]] = {}  # "ModelConfig.attention" -> its registry


def check_choice(setting: str, name: str, options: Mapping[str, Any] | Any = None) -> None:
    """Refuse a plug-in name (and option names) that the registry owning `setting` does not
    hold: how a configuration checks its plug-ins when it is made, without importing the
    layers that own them. A setting whose registry does not exist yet (its package is not
    imported) is left to the registry when the plug-in is built.

    Args:
        setting: "ModelConfig.attention", "ModelConfig.positional", ...
        name: the plug-in's name.
        options: its options (a mapping or (name, value) pairs), or None not to check them.

    Raises:
        UnknownPlugin: no plug-in of that name (the message lists those registered, and
            any that failed to load).
        ValueError: an option the plug-in does not declare.
    """
    registry = _BY_SETTING.get(setting)
    if registry is None:
        return
    registry.get(name)
    if options is not None:
        registry.options(name, dict(options))


class Registry(Generic[T]):
    """The plug-ins of one kind, by name.

    Args:
        kind: what one plug-in is, for messages ("attention kernel").
        package: the dotted name of the package whose modules are the built-in
            plug-ins; each is imported on first use.
        group: the entry-point group through which installed packages add plug-ins.
        setting: the setting that names a plug-in ("ModelConfig.attention"), for messages.
        options_setting: the setting that holds the chosen plug-in's own options
            ("ModelConfig.attention_options"), for messages.
    """

    def __init__(
        self, kind: str, package: str, group: str, setting: str = "", options_setting: str = ""
    ) -> None:
        self.kind, self.package, self.group, self.setting = kind, package, group, setting
        self.options_setting = options_setting
        if setting:
            _BY_SETTING[setting] = self
        self._failed: dict[str, str] = {}  # entry point -> why it did not load
        self._loaded: set[str] = set()  # the entry points loaded ("name = value")
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}  # name -> the module that registered it
        self._discovered = False
        self._lock = threading.RLock()

    def register(self, name: str, options: tuple[str, ...] | None = None) -> Callable[[T], T]:
        """A decorator that registers its argument (a class or a factory) under `name`.

        Args:
            name: the name the setting gives.
            options: the names of the plug-in's own settings, which it takes as keyword
                arguments; set as its `options` attribute (a class may declare that
                attribute itself instead).

        Raises:
            ValueError: `name` is empty, has surrounding spaces, or is taken.
        """
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(
                f"a {self.kind} needs a non-empty name without surrounding spaces, got {name!r}"
            )

        def add(entry: T) -> T:
            if options is not None:
                entry.options = tuple(options)  # type: ignore[attr-defined]
            self.add(name, entry)
            return entry

        return add

    def add(self, name: str, entry: T) -> None:
        """Register `entry` under `name` (the decorator's work, for non-decorator use)."""
        origin = getattr(entry, "__module__", None) or repr(entry)
        with self._lock:
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._origins[name]}); "
                    "choose another name"
                )
            self._entries[name] = entry
            self._origins[name] = origin

    def unregister(self, name: str) -> None:
        """Remove the plug-in `name` (a test's or a notebook's own, before registering anew).

        Raises:
            UnknownPlugin: nothing is registered under `name`.
        """
        self.get(name)
        with self._lock:
            del self._entries[name], self._origins[name]

    def get(self, name: str) -> T:
        """The plug-in registered under `name`.

        Raises:
            UnknownPlugin: no plug-in of this kind has that name; the message lists them.
        """
        self._discover()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            where = f" ({self.setting})" if self.setting else ""
            failed = "".join(
                f"; plug-in {entry} failed to load: {why}" for entry, why in self._failed.items()
            )
            raise UnknownPlugin(
                f"unknown {self.kind} {name!r}{where}; registered: {', '.join(self.names())}"
                f"{failed}"
            ) from None

    def options(self, name: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """`given` as a dict, checked against the options plug-in `name` declares.

        Raises:
            UnknownPlugin: no plug-in of this kind has that name.
            ValueError: an option the plug-in does not declare (the message names the
                setting and the options it takes).
        """
        declared = tuple(getattr(self.get(name), "options", ()))
        given = dict(given or {})
        unknown = sorted(set(given) - set(declared))
        if unknown:
            where = f"{self.options_setting}: " if self.options_setting else ""
            raise ValueError(
                f"{where}{self.kind} {name!r} takes no option {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(declared) or 'none'}"
            )
        return given

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        self._discover()
        return tuple(sorted(self._entries))

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, plug-in) pairs, sorted by name."""
        for name in self.names():
            yield name, self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.package!r}, {self.group!r})"

    def _discover(self) -> None:
        """Import the package's modules, then the entry points' (once)."""
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            self._discovered = True  # the modules imported below call back into `add`
            for module in _modules_of(self.package):
                importlib.import_module(module)
            self.refresh()

    def refresh(self) -> None:
        """Load the entry points of this registry's group not loaded yet: plug-in packages
        installed since the registry first looked (in a running notebook after `pip
        install`, or a test's package)."""
        with self._lock:
            self._discover()
            for point in importlib.metadata.entry_points(group=self.group):
                if f"{point.name} = {point.value}" not in self._loaded:
                    self._load_entry_point(point)

    def _load_entry_point(self, point: importlib.metadata.EntryPoint) -> None:
        self._loaded.add(f"{point.name} = {point.value}")
        self._failed.pop(point.name, None)
        try:
            loaded = point.load()
        except Exception as err:  # a broken third-party plug-in must not break aiayn
            log.warning("skipping %s plug-in %r (%s): %s", self.kind, point.name, point.value, err)
            self._failed[point.name] = f"{point.value} ({type(err).__name__}: {err})"
            return
        if not isinstance(loaded, ModuleType) and point.name not in self._entries:
            self.add(point.name, loaded)


def _modules_of(package: str) -> list[str]:
    """The dotted names of the modules directly inside `package`, sorted."""
    path = importlib.import_module(package).__path__
    return sorted(f"{package}.{info.name}" for info in pkgutil.iter_modules(path))
