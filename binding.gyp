{
  "targets": [
    {
      "target_name": "minisandbox",
      "sources": [
        "native/addon.cc",
        "native/plan.cc",
        "native/spawn.cc",
        "native/wire.cc",
        "native/child.cc",
        "native/child_mounts.cc",
        "native/child_exec.cc",
        "native/child_init.cc",
        "native/watchers.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_DISABLE_CPP_EXCEPTIONS"],
      "cflags_cc": ["-std=c++20", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-O2"]
    },
    {
      # The spawner (native/spawner.cc): the same child code as the addon,
      # without N-API, in a binary of its own whose clones are cheap.
      # Linked statically: a clone then maps no shared library and binds no
      # symbol lazily (each PID 1 and monitor resolved and wrote its own
      # GOT entries, a copy-on-write fault each), and the binary needs no
      # particular glibc on the machine it runs on. Its code and read-only
      # data share one segment, alone in the first 2 MiB of the address
      # space, which the spawner moves onto a huge page at its start
      # (MapCodeOnHugePage, native/spawner.cc); stripped, as the padding
      # that alignment puts in the file is size enough.
      "target_name": "msbx-spawner",
      "type": "executable",
      "sources": [
        "native/spawner.cc",
        "native/spawn.cc",
        "native/wire.cc",
        "native/child.cc",
        "native/child_mounts.cc",
        "native/child_exec.cc",
        "native/child_init.cc"
      ],
      "cflags_cc": ["-std=c++20", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-O2"],
      "ldflags": ["-Wl,--gc-sections", "-static", "-s", "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=0x200000"]
    }
  ]
}
