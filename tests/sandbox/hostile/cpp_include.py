# A C++ source that includes files it must not read: its diagnostics would carry their bytes. The service's .env
# first; the compiler stops at the first include it cannot find.
from torch.utils.cpp_extension import load_inline

reached("handing the includes to the compiler")
report()
load_inline(
    name="hostile_include",
    cpp_sources='#include "__DOTENV__"\n#include "/etc/shadow"\n#include "__CANARY__"\n#include "__DATABASE__"\n'
    "int f() { return 0; }",
    functions=["f"],
    verbose=False,
)
