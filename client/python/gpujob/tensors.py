"""NumPy arrays to and from the daemon's tensors: the dtype names, the inputs' binary section
of a submission, and the outputs of an answer (framed bytes, JSON data or a raw download).

NumPy has no bfloat16: a bf16 input is sent as a (uint16 array of the bits, "bf16") pair, and a
bf16 output comes back widened to float32, which holds every bf16 value exactly."""

import numpy as np

# The daemon's dtype names and their little-endian NumPy dtypes.
DTYPES = {
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"),
    "i32": np.dtype("<i4"),
    "u32": np.dtype("<u4"),
    "i64": np.dtype("<i8"),
}
BF16_BITS = np.dtype("<u2")
_NAMES = {(dt.kind, dt.itemsize): name for name, dt in DTYPES.items()}


def dtype_name(dtype):
    """The daemon's name of a NumPy dtype; ValueError for one it has no tensors of."""
    dt = np.dtype(dtype)
    name = _NAMES.get((dt.kind, dt.itemsize))
    if name is None:
        raise ValueError(f"dtype {dt} has no gpujobd counterpart (f32, f16, f64, i8, i32, u32, "
                         "i64; bf16 as a (uint16 bits, 'bf16') pair)")
    return name


def as_input(value):
    """(dtype name, little-endian C-contiguous array) for an input given as an array, a
    scalar, a list, or an (array, dtype name) pair that sends the array's bytes as that dtype."""
    if isinstance(value, tuple):
        array, name = value
        array = np.asarray(array)
        want = BF16_BITS if name == "bf16" else DTYPES.get(name)
        if want is None:
            raise ValueError(f"unknown dtype '{name}'")
        if array.dtype.itemsize != want.itemsize:
            raise ValueError(f"a {name} input needs elements of {want.itemsize} bytes, not "
                             f"{array.dtype}")
        return name, np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    array = np.asarray(value)
    name = dtype_name(array.dtype)
    return name, np.ascontiguousarray(array, dtype=DTYPES[name])


class Section:
    """The binary section of a submission: input bytes appended back to back, each named in
    the JSON by its binary_offset."""

    def __init__(self):
        self.parts = []
        self.length = 0

    def add(self, array):
        offset = self.length
        data = array.tobytes()
        self.parts.append(data)
        self.length += len(data)
        return offset

    def tobytes(self):
        return b"".join(self.parts)


def _from_bytes(buf, dtype, shape, offset=0):
    """A writable array of dtype and shape read from buf at offset (bf16 widened to f32)."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dtype == "bf16":
        bits = np.frombuffer(buf, BF16_BITS, count, offset).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if dtype not in DTYPES:
        raise ValueError(f"the daemon sent an unknown dtype '{dtype}'")
    return np.frombuffer(buf, DTYPES[dtype], count, offset).reshape(shape).copy()


def _from_data(data, dtype, shape):
    """An array from an output's JSON data: a flat list with "nan", "inf", "-inf" strings."""
    target = np.float32 if dtype == "bf16" else DTYPES[dtype]
    if target.kind == "f":
        data = [float(x) if isinstance(x, str) else x for x in data]
    return np.array(data, dtype=target).reshape(shape)


def output_inline(desc, section):
    """The array of an output described in a job's JSON, or None when its bytes are not in
    the answer (past the daemon's max_inline_output_bytes: download them)."""
    shape = tuple(desc.get("shape", ()))
    if "binary_offset" in desc:
        if desc["binary_offset"] + desc["bytes"] > len(section):
            raise ValueError("an output's binary_offset points past the answer's binary section")
        return _from_bytes(section, desc["dtype"], shape, desc["binary_offset"])
    if "data" in desc:
        return _from_data(desc["data"], desc["dtype"], shape)
    return None


def output_raw(body, dtype, shape_header):
    """The array of a raw download (X-Dtype and X-Shape headers)."""
    shape = tuple(int(d) for d in shape_header.split(",")) if shape_header else ()
    return _from_bytes(body, dtype, shape)
