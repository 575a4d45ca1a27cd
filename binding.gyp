{
  "targets": [
    {
      "target_name": "minisandbox",
      "sources": [
        "native/addon.cc",
        "native/plan.cc",
        "native/child.cc",
        "native/child_mounts.cc",
        "native/child_exec.cc",
        "native/child_init.cc",
        "native/watchers.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_DISABLE_CPP_EXCEPTIONS"],
      
      
      "cflags_cc": ["-std=c++20", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-O2"]
    }
  ]
}
