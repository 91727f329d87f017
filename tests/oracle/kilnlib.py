"""ctypes bindings of libkiln ($KILN_LIB) shared by the oracle tests."""
import ctypes
import os
import sys

VP = ctypes.c_void_p


class QTensor(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("data", VP), ("scale", VP), ("global_scale", ctypes.c_float), ("group", ctypes.c_int64)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type_name", ctypes.c_char_p), ("supported", ctypes.c_int),
                ("format", ctypes.c_int), ("n_dims", ctypes.c_int), ("ne", ctypes.c_int64 * 4),
                ("bytes", ctypes.c_size_t), ("group", ctypes.c_int64), ("input_scale", ctypes.c_float)]


class ModelInfo(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int64) for f in ("n_layers", "d_model", "d_ffn", "n_heads", "n_kv_heads",
                                              "vocab", "ctx")] + [("rms_eps", ctypes.c_float)]


class TensorType(ctypes.Structure):
    """A row of kiln_gguf_tensor_type_get (graph/gguf.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("block", ctypes.c_int), ("type_size", ctypes.c_int)]


def load():
    path = os.environ.get("KILN_LIB")
    if not path:
        sys.exit("KILN_LIB must name libkiln.so")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        sys.exit(f"cannot load KILN_LIB: {e}")
    sigs = [
        ("kiln_last_error", [], ctypes.c_char_p),
        ("kiln_format_from_name", [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        ("kiln_format_data_bytes", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_size_t)],
         ctypes.c_int),
        ("kiln_quantize", [VP, ctypes.POINTER(QTensor)], ctypes.c_int),
        ("kiln_dequantize", [ctypes.POINTER(QTensor), VP], ctypes.c_int),
        ("kiln_model_open", [ctypes.c_char_p, ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_safetensors_open", [ctypes.c_char_p, ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_model_close", [VP], None),
        ("kiln_model_container", [VP], ctypes.c_char_p),
        ("kiln_model_arch", [VP], ctypes.c_char_p),
        ("kiln_model_get_info", [VP, ctypes.POINTER(ModelInfo)], None),
        ("kiln_model_n_tensors", [VP], ctypes.c_int),
        ("kiln_model_tensor_at", [VP, ctypes.c_int, ctypes.POINTER(TensorInfo)], ctypes.c_int),
        ("kiln_model_weight", [VP, ctypes.c_char_p, ctypes.POINTER(QTensor)], ctypes.c_int),
        ("kiln_model_build_ffn", [VP, VP, ctypes.c_int], ctypes.c_int),
        ("kiln_model_build_linears", [VP, VP, ctypes.c_int], ctypes.c_int),
        ("kiln_gguf_n_kv", [VP], ctypes.c_int),
        ("kiln_gguf_kv_at", [VP, ctypes.c_int, ctypes.POINTER(VP)], ctypes.c_char_p),
        ("kiln_gguf_value_summary", [VP, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_char_p),
        ("kiln_gguf_tensor_type_get", [ctypes.c_uint32], ctypes.POINTER(TensorType)),
        ("kiln_graph_create", [ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_graph_destroy", [VP], None),
        ("kiln_graph_n_tensors", [VP], ctypes.c_int),
        ("kiln_graph_tensor", [VP, ctypes.c_int], VP),
        ("kiln_tensor_src", [VP, ctypes.c_int], VP),
        ("kiln_model_open_with",
         [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int * 2), ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_model_warnings", [VP], ctypes.POINTER(ctypes.c_char_p)),
        ("kiln_tensor_op", [VP], ctypes.c_int),
        ("kiln_tensor_name", [VP], ctypes.c_char_p),
        ("kiln_cpu_create", [VP, VP, ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_cpu_destroy", [VP], None),
        ("kiln_cpu_run", [VP, ctypes.c_int64, ctypes.POINTER(VP), ctypes.POINTER(VP)], ctypes.c_int),
    ]
    for name, args, res in sigs:
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    return lib


def last_error(lib):
    return lib.kiln_last_error().decode(errors="replace")


class Model:
    """An open kiln_model: opener is kiln_model_open or a reader's own open."""

    def __init__(self, lib, path, opener="kiln_model_open"):
        self.lib = lib
        self.h = VP()
        st = getattr(lib, opener)(str(path).encode(), ctypes.byref(self.h))
        if st != KILN_OK:
            raise AssertionError(f"open {path}: {last_error(lib)}")

    def close(self):
        self.lib.kiln_model_close(self.h)

    def tensors(self):
        out = []
        for i in range(self.lib.kiln_model_n_tensors(self.h)):
            t = TensorInfo()
            assert self.lib.kiln_model_tensor_at(self.h, i, ctypes.byref(t)) == KILN_OK, last_error(self.lib)
            out.append(t)
        return out


KILN_OK = 0
KILN_ERR_MALFORMED = 4
KILN_ERR_UNSUPPORTED = 5
KILN_ERR_NOT_FOUND = 7
KILN_OP_LINEAR = 3
