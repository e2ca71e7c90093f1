"""bert_suite: the BERT paper end to end on the Hugging Face stack.

Importing the package registers the BertSuite family with the transformers Auto classes, so
`AutoModelForSequenceClassification.from_pretrained(dir)` works on a bert_suite checkpoint.

The package imports neither torch nor transformers itself: the model classes load when first named
(`bert_suite.BertSuiteModel`), and the registration runs when transformers' Auto modules load (at once,
when they already have). So the data commands (`bert-suite tokenizer`, `pretrain-data`, `corpus`,
`decontaminate`, `squad-small`) and their Dask workers start without torch's seconds and hundreds of MB,
and everyone who uses a model through an Auto class finds the family registered.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading

__version__ = "0.1.0"

_CONFIG_NAMES = ("PRESETS", "BertSuiteConfig", "BertSuiteConfigError")
_MODEL_NAMES = ("BertSuiteForMaskedLM", "BertSuiteForMultipleChoice", "BertSuiteForNextSentencePrediction",
                "BertSuiteForPreTraining", "BertSuiteForQuestionAnswering", "BertSuiteForSequenceClassification",
                "BertSuiteForTokenClassification", "BertSuiteModel", "BertSuitePreTrainedModel",
                "CheckpointMismatchError")
# Auto class -> our class for it
_AUTO = {"AutoModel": "BertSuiteModel", "AutoModelForPreTraining": "BertSuiteForPreTraining",
         "AutoModelForMaskedLM": "BertSuiteForMaskedLM",
         "AutoModelForSequenceClassification": "BertSuiteForSequenceClassification",
         "AutoModelForQuestionAnswering": "BertSuiteForQuestionAnswering",
         "AutoModelForMultipleChoice": "BertSuiteForMultipleChoice",
         "AutoModelForNextSentencePrediction": "BertSuiteForNextSentencePrediction",
         "AutoModelForTokenClassification": "BertSuiteForTokenClassification"}
_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_MODEL_AUTO = "transformers.models.auto.modeling_auto"


def __getattr__(name: str):
    """The model family, imported when first named (PEP 562)."""
    if name in _CONFIG_NAMES:
        module = importlib.import_module(".configuration_bert_suite", __name__)
    elif name in _MODEL_NAMES:
        module = importlib.import_module(".modeling_bert_suite", __name__)
    elif name == "AUTO_CLASSES":
        auto = importlib.import_module(_MODEL_AUTO)
        return {getattr(auto, a): __getattr__(ours) for a, ours in _AUTO.items()}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


def _register(module_name: str) -> None:
    """Make the Auto mappings of `module_name` (transformers' configuration_auto or modeling_auto, just imported)
    register the family at their first look-up. Not now: that module may be imported from deep inside
    transformers' own imports (a docstring decorator of BertConfig), where importing our model, which imports
    transformers' BERT, would meet half-initialised modules."""
    module = sys.modules[module_name]
    if module_name == _CONFIG_AUTO:
        _defer([module.CONFIG_MAPPING], _register_config)
    else:
        _defer([getattr(module, auto)._model_mapping for auto in _AUTO], _register_models)


def _register_config() -> None:
    from .configuration_bert_suite import BertSuiteConfig

    sys.modules[_CONFIG_AUTO].AutoConfig.register(BertSuiteConfig.model_type, BertSuiteConfig, exist_ok=True)


def _register_models() -> None:
    from . import modeling_bert_suite
    from .configuration_bert_suite import BertSuiteConfig

    for auto, ours in _AUTO.items():
        getattr(sys.modules[_MODEL_AUTO], auto).register(BertSuiteConfig, getattr(modeling_bert_suite, ours),
                                                           exist_ok=True)


_LOOKUPS = ("__getitem__", "__contains__", "__iter__", "__len__", "get", "keys", "values", "items", "__reduce__")
_DEFERRED: dict[type, type] = {}  # a mapping's class -> its subclass whose look-ups register first
_LOCK = threading.RLock()  # the registrations and the class swaps, one thread at a time


def _importing() -> bool:
    """Whether a module of transformers or of this package is being imported at this moment (its body runs)."""
    return any(getattr(getattr(module, "__dict__", {}).get("__spec__"), "_initializing", False)  # not getattr:
               for name, module in list(sys.modules.items())  # a lazy module would import on a miss
               if name.partition(".")[0] in ("transformers", "bert_suite"))


class _Registration:
    """`register`, waiting for the first look-up of its mappings, which then answers with the family in them."""

    def __init__(self, mappings: list, register) -> None:
        self.mappings, self.register, self.waiting = mappings, register, True
        self.bases = [type(mapping)._deferred_from for mapping in mappings]
        self.local = threading.local()  # .busy: this thread is in a look-up of these mappings

    def look_up(self, method, mapping, args, kwargs):
        """`method` of the mapping's own class, after the registration; a look-up inside another (made by
        `register`, or by `method` itself) answers at once."""
        if getattr(self.local, "busy", False):
            return method(mapping, *args, **kwargs)
        self.local.busy = True
        try:
            self.ready()
            return method(mapping, *args, **kwargs)
        finally:
            self.local.busy = False

    def ready(self) -> None:
        with _LOCK:
            if not self.waiting:  # another thread registered while this one waited for the lock
                return
            try:
                self.register()
            except ImportError:
                # a look-up from inside an import still running (transformers' own, the case the deferral is
                # for) answers without the family and leaves it to the next; any other is the error it is
                if _importing():
                    return
                raise
            for mapping, base in zip(self.mappings, self.bases, strict=True):
                mapping.__class__ = base
            self.waiting = False


def _defer(mappings: list, register) -> None:
    """Turn each mapping into a subclass of its own class whose look-ups first run `register` and then answer
    with the mapping's own method; on success the mappings go back to their own class. A failed registration
    leaves them deferred: the next look-up tries again."""
    for mapping in mappings:
        base = getattr(type(mapping), "_deferred_from", type(mapping))
        if base not in _DEFERRED:
            def wrap(method):
                def look_up(self, *args, **kwargs):
                    return self._registration.look_up(method, self, args, kwargs)
                return look_up
            _DEFERRED[base] = type(f"Registering{base.__name__}", (base,),
                                   {"_deferred_from": base, **{n: wrap(getattr(base, n)) for n in _LOOKUPS}})
        mapping.__class__ = _DEFERRED[base]
    registration = _Registration(mappings, register)
    for mapping in mappings:
        mapping._registration = registration


class _RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `_register` right after one of transformers' Auto modules is executed (Python has no post-import
    hook of its own): this finder hands the import to the real loader and registers when it is done."""

    def __init__(self):
        self.loaders: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in (_CONFIG_AUTO, _MODEL_AUTO) or fullname in self.loaders:
            return None
        self.loaders[fullname] = None  # the search below must not find this finder again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            del self.loaders[fullname]
        if spec is None or spec.loader is None:
            return None
        self.loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        name = module.__spec__.name
        loader = self.loaders[name]
        module.__spec__.loader = module.__loader__ = loader  # as if it had loaded the module itself
        try:
            loader.exec_module(module)
        finally:
            del self.loaders[name]
        _register(name)
        if all(n in sys.modules for n in (_CONFIG_AUTO, _MODEL_AUTO)) and self in sys.meta_path:
            sys.meta_path.remove(self)  # both seen: nothing more to watch


for _name in (_CONFIG_AUTO, _MODEL_AUTO):
    if _name in sys.modules:  # transformers' Auto classes are loaded already
        _register(_name)
if not all(name in sys.modules for name in (_CONFIG_AUTO, _MODEL_AUTO)) and not any(
        isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterImport())

__all__ = ["AUTO_CLASSES", *_CONFIG_NAMES, *_MODEL_NAMES]
