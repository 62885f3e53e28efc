# A C++ source that includes files it must not read: its diagnostics would carry their bytes.
from torch.utils.cpp_extension import load_inline

report()
load_inline(
    name="hostile_include",
    cpp_sources='#include "/etc/shadow"\n#include "__CANARY__"\n#include "__DATABASE__"\nint f() { return 0; }',
    functions=["f"],
    verbose=False,
)
