#!/usr/bin/env python3
"""Writes the recorded machines doctor's tests read (tests/data/doctor/<machine>/): sysfs trees
shaped like the real /sys/devices/pci... hierarchy with /sys/bus/pci/devices links, config-space
blobs built field by field, and the /proc parts doctor reads. Rerun after changing a machine:
    python3 tests/data/doctor/make_fixtures.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def config_space(vendor, device, class_code, bridge, pcie=None, ext=(), length=4096):
    """pcie: dict(port_type, max_speed, max_width, cur_speed, cur_width, aspm) speed codes 1..6.
    ext: list of (cap_id, payload bytes) placed from 0x100 on, 0x40 apart."""
    b = bytearray(length if length >= 256 else 256)
    struct.pack_into("<HH", b, 0, vendor, device)
    struct.pack_into("<H", b, 0x06, 0x10 if pcie else 0)  # capability list present
    b[0x09], b[0x0A], b[0x0B] = class_code & 0xFF, (class_code >> 8) & 0xFF, class_code >> 16
    b[0x0E] = 1 if bridge else 0
    if pcie:
        b[0x34] = 0x40
        b[0x40], b[0x41] = 0x10, 0x00
        struct.pack_into("<H", b, 0x42, (pcie["port_type"] << 4) | 2)
        struct.pack_into("<I", b, 0x4C, pcie["max_speed"] | (pcie["max_width"] << 4))
        struct.pack_into("<H", b, 0x50, pcie.get("aspm", 0))
        struct.pack_into("<H", b, 0x52, pcie["cur_speed"] | (pcie["cur_width"] << 4))
    offset = 0x100
    for i, (cap_id, payload) in enumerate(ext):
        next_offset = offset + 0x40 if i + 1 < len(ext) else 0
        struct.pack_into("<I", b, offset, cap_id | (1 << 16) | (next_offset << 20))
        b[offset + 4:offset + 4 + len(payload)] = payload
        offset += 0x40
    return bytes(b[:length])


def aer_cap():
    return (0x0001, b"\0" * 8)


def acs_cap(control):
    return (0x000D, struct.pack("<HH", 0x005F, control))


def ats_cap(enabled):
    return (0x000F, struct.pack("<HH", 0x0020, 0x8000 if enabled else 0))


def rebar_cap(bar, current_code, max_code):
    supported = sum(1 << (code + 4) for code in range(0, max_code + 1))
    control = bar | (1 << 5) | (current_code << 8)
    return (0x0015, struct.pack("<II", supported, control))


SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
         5: "32.0 GT/s PCIe"}


class Machine:
    def __init__(self, name):
        self.root = os.path.join(HERE, name)
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)

    def write(self, path, text, mode="w"):
        full = os.path.join(self.root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if isinstance(text, bytes):
            mode = "wb"
        with open(full, mode) as f:
            f.write(text)

    def link(self, path, target):
        full = os.path.join(self.root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(target, full)  # bytes targets are kept byte for byte

    def platform(self, policy="default", cmdline="", groups=None, processes=None):
        choices = ["default", "performance", "powersave", "powersupersave"]
        self.write("sys/module/pcie_aspm/parameters/policy",
                   " ".join(f"[{c}]" if c == policy else c for c in choices) + " \n")
        self.write("proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=/dev/nvme0n1p2 ro {cmdline}\n")
        self.write("proc/sys/kernel/osrelease", "6.8.0-49-generic\n")
        self.write("proc/uptime", "86400.00 1300000.00\n")
        self.write("proc/self/cgroup", "0::/user.slice/user-1000.slice/session-3.scope\n")
        for group, kind in (groups or {}).items():
            self.write(f"sys/kernel/iommu_groups/{group}/type", kind + "\n")

    def device(self, sysfs_dir, vendor, device, class_code, link=None, config=None, driver=None,
               numa=-1, cpus="0-31", group=None, aer=None, aspm_link=None, extra=None,
               boot_vga=None, runtime_status=None):
        bdf = os.path.basename(sysfs_dir)
        d = "sys/devices/" + sysfs_dir
        self.write(f"{d}/vendor", f"0x{vendor:04x}\n")
        self.write(f"{d}/device", f"0x{device:04x}\n")
        self.write(f"{d}/class", f"0x{class_code:06x}\n")
        self.write(f"{d}/numa_node", f"{numa}\n")
        self.write(f"{d}/local_cpulist", cpus + "\n")
        if link:
            cur_speed, cur_width, max_speed, max_width = link
            self.write(f"{d}/current_link_speed", SPEED[cur_speed] + "\n")
            self.write(f"{d}/current_link_width", f"{cur_width}\n")
            self.write(f"{d}/max_link_speed", SPEED[max_speed] + "\n")
            self.write(f"{d}/max_link_width", f"{max_width}\n")
        if config is not None:
            self.write(f"{d}/config", config, "wb")
        if boot_vga is not None:
            self.write(f"{d}/boot_vga", f"{1 if boot_vga else 0}\n")
        if runtime_status is not None:
            self.write(f"{d}/power/runtime_status", runtime_status + "\n")
            self.write(f"{d}/power/control", "auto\n")
        if driver:
            self.link(f"{d}/driver", f"/sys/bus/pci/drivers/{driver}")
        if group is not None:
            self.link(f"{d}/iommu_group", f"/sys/kernel/iommu_groups/{group}")
        for kind, lines in (aer or {}).items():
            self.write(f"{d}/aer_dev_{kind}", "".join(f"{k} {v}\n" for k, v in lines))
        for state, on in (aspm_link or {}).items():
            self.write(f"{d}/link/{state}", f"{1 if on else 0}\n")
        self.link(f"sys/bus/pci/devices/{bdf}", "/" + d)


AER_CLEAN = {
    "correctable": [("RxErr", 0), ("BadTLP", 0), ("BadDLLP", 0), ("Rollover", 0), ("Timeout", 0),
                    ("NonFatalErr", 0), ("CorrIntErr", 0), ("HeaderOF", 0), ("TOTAL_ERR_COR", 0)],
    "fatal": [("Undefined", 0), ("DLP", 0), ("SDES", 0), ("TLP", 0), ("FCP", 0), ("CmpltTO", 0),
              ("TOTAL_ERR_FATAL", 0)],
    "nonfatal": [("Undefined", 0), ("DLP", 0), ("SDES", 0), ("TLP", 0), ("CmpltTO", 0),
                 ("TOTAL_ERR_NONFATAL", 0)],
}


GIB = 1 << 30


def nvml_view(processes, used, samples, total=140 * GIB, reserved=GIB // 2):
    """A recorded NVML view (nvml.json: the "nvidia" object of `doctor --json`) of the H200 at
    0000:17:00.0. processes: {pid: bytes}; samples: [(pid, sm %, memory %)] of the last 10 s.
    Sizes are synthetic round figures, not read from a device."""
    return {
        "driver_version": "570.00", "cuda_driver_version": 12080,
        "gpus": [{
            "index": 0, "bdf": "0000:17:00.0", "name": "NVIDIA H200",
            "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "memory": {"total_bytes": total, "used_bytes": used, "reserved_bytes": reserved,
                       "free_bytes": total - used - reserved},
            "pcie": {"current_generation": 5, "current_width": 16, "max_generation": 5,
                     "max_width": 16},
            "performance_state": 0, "persistence_mode": True,
            "processes": [{"pid": pid, "used_memory_bytes": size}
                          for pid, size in processes.items()],
            "process_utilization": {"window_s": 10, "samples": [
                {"pid": pid, "sm_percent": sm, "memory_percent": mem} for pid, sm, mem in samples]},
        }],
    }


def h200_server(name, policy="default", cmdline="intel_iommu=on iommu=pt", group_type="identity",
                acs_control=0x0000, aer=None, gpu_aspm=None, processes=None, nvml=None):
    """Root port 0000:16:01.0 (Gen5 x16) with an H200 (10de:2335) at 0000:17:00.0 on NUMA node 0.
    nvml: a recorded NVML view written to nvml.json (see nvml_view)."""
    m = Machine(name)
    m.platform(policy=policy, cmdline=cmdline, groups={30: group_type, 31: group_type})
    port = "pci0000:16/0000:16:01.0"
    m.device(port, 0x8086, 0x352a, 0x060400, link=(5, 16, 5, 16), numa=0, cpus="0-47",
             config=config_space(0x8086, 0x352a, 0x060400, True,
                                 dict(port_type=4, max_speed=5, max_width=16, cur_speed=5, cur_width=16),
                                 [aer_cap(), acs_cap(acs_control)]),
             driver="pcieport", group=30, aer=AER_CLEAN)
    m.device(port + "/0000:17:00.0", 0x10de, 0x2335, 0x030200, link=(5, 16, 5, 16), numa=0,
             cpus="0-47", driver="nvidia", group=31, aer=aer or AER_CLEAN, aspm_link=gpu_aspm,
             config=config_space(0x10de, 0x2335, 0x030200, False,
                                 dict(port_type=0, max_speed=5, max_width=16, cur_speed=5, cur_width=16,
                                      aspm=2 if gpu_aspm else 0),
                                 [aer_cap(), ats_cap(False), rebar_cap(1, 18, 18)]))
    for pid, (comm, state, ppid, session, fds, cgroup) in (processes or {}).items():
        # comm and cgroup may be bytes: the kernel passes them on unchecked, not as UTF-8.
        raw = lambda text: text if isinstance(text, bytes) else text.encode()
        m.write(f"proc/{pid}/stat", f"{pid} (".encode() + raw(comm) +
                f") {state} {ppid} {session} {session} 0 -1 4194560 100 0 0 0 5 3\n".encode())
        m.write(f"proc/{pid}/cgroup", b"0::" + raw(cgroup) + b"\n")
        os.makedirs(os.path.join(m.root, f"proc/{pid}/fd"), exist_ok=True)
        for fd, target in fds.items():
            m.link(f"proc/{pid}/fd/{fd}", target)
    if nvml is not None:
        m.write("nvml.json", json.dumps(nvml, indent=2) + "\n")
    return m


def laptop(name="laptop-igpu-dgpu", display="igpu", runtime_status="active", port_width=8,
           dgpu_link=(1, 8, 4, 8)):
    """Intel Iris Xe iGPU on the root complex + RTX 4060 Laptop (AD107M, 10de:28e0: an x8 chip,
    Gen4 x8 max) idling at Gen1, recorded without root: the dGPU's config space is the 64-byte
    unprivileged view. display: which GPU has boot_vga = 1 ("igpu" or "dgpu", the firmware's
    discrete/MUX mode); runtime_status: the dGPU's power/runtime_status."""
    m = Machine(name)
    m.platform(policy="default", cmdline="quiet splash")
    m.device("pci0000:00/0000:00:02.0", 0x8086, 0xa7a0, 0x030000, driver="i915", cpus="0-15",
             config=config_space(0x8086, 0xa7a0, 0x030000, False, None, length=64),
             boot_vga=display == "igpu", runtime_status="active")
    port = "pci0000:00/0000:00:01.0"
    m.device(port, 0x8086, 0xa70d, 0x060400, link=(dgpu_link[0], port_width, 4, port_width),
             driver="pcieport", cpus="0-15",
             config=config_space(0x8086, 0xa70d, 0x060400, True, None, length=64))
    m.device(port + "/0000:01:00.0", 0x10de, 0x28e0, 0x030000, link=dgpu_link, driver="nvidia",
             cpus="0-15", config=config_space(0x10de, 0x28e0, 0x030000, False, None, length=64),
             boot_vga=display == "dgpu", runtime_status=runtime_status)
    return m


if __name__ == "__main__":
    h200_server("h200-healthy")
    laptop()
    # The dGPU asleep (runtime PM, D3cold): its link reads as the lowest rate until it wakes.
    laptop("laptop-dgpu-suspended", runtime_status="suspended")
    # The firmware's discrete (MUX) mode: the NVIDIA GPU drives the display.
    laptop("laptop-dgpu-display", display="dgpu")
    # The same x8 chip trained at x4: a real fault, still a warning.
    laptop("laptop-dgpu-x4", dgpu_link=(4, 4, 4, 8))
    h200_server("aspm-powersave", policy="powersave", gpu_aspm={"l1_aspm": True, "l0s_aspm": False})
    h200_server("iommu-translated", cmdline="intel_iommu=on", group_type="DMA-FQ",
                acs_control=0x001d)
    aer = dict(AER_CLEAN)
    aer["correctable"] = [("RxErr", 35), ("BadTLP", 2), ("BadDLLP", 0), ("Rollover", 0),
                          ("Timeout", 0), ("NonFatalErr", 0), ("CorrIntErr", 0), ("HeaderOF", 0),
                          ("TOTAL_ERR_COR", 37)]
    h200_server("aer-errors", aer=aer)
    h200_server("zombie-holding-gpu", processes={
        # A training job whose leader exited while a thread still holds the GPU; its parent shell
        # never reaped it.
        4242: ("python3", "Z", 4100, 4100, {3: "/dev/nvidiactl", 4: "/dev/nvidia0",
                                            5: "/dev/nvidia-uvm"},
               "/user.slice/user-1000.slice/session-3.scope"),
        4100: ("bash", "S", 4000, 4100, {}, "/user.slice/user-1000.slice/session-3.scope"),
        4000: ("sshd", "S", 1, 4000, {}, "/system.slice/ssh.service"),
        # A healthy daemon holding the control device: not a leak.
        1500: ("nvidia-persiste", "S", 1, 1500, {3: "/dev/nvidiactl"},
               "/system.slice/nvidia-persistenced.service"),
    }, nvml=nvml_view({4242: 20 * GIB}, used=20 * GIB, samples=[]))
    # "Memory stuck at 72 %": a notebook kernel that finished its work still holds 60 GiB, a
    # training job runs beside it, a small idle context stays under the threshold, and 8 GiB are
    # held by a process of another container that NVML does not list here.
    gpu = {3: "/dev/nvidiactl", 4: "/dev/nvidia0", 5: "/dev/nvidia-uvm"}
    session = "/user.slice/user-1000.slice/session-3.scope"
    h200_server("idle-memory-holder", processes={
        5000: ("jupyter-lab", "S", 1, 5000, {}, session),
        5100: ("python3", "S", 5000, 5000, gpu, session),
        5200: ("torchrun", "R", 5000, 5000, gpu, session),
        5300: ("python3", "S", 5000, 5000, gpu, session),
    }, nvml=nvml_view({5100: 60 * GIB, 5200: 70 * GIB, 5300: 600 << 20},
                      used=138 * GIB + (600 << 20), samples=[(5200, 97, 41), (5200, 95, 40)]))
    # The same leak, with names no process is obliged to keep tidy: prctl(PR_SET_NAME) takes any
    # bytes, so comm holds a terminal escape, a newline and bytes that are not UTF-8 (0xff, an
    # overlong 0xc0 0xaf, a C1 CSI as UTF-8); the cgroup path and an fd target do too.
    h200_server("hostile-process-names", processes={
        4242: (b"\x1b[2Jev\xffil\nx\xc0\xaf\xc2\x9b", "Z", 4100, 4100,
               {3: "/dev/nvidiactl", 4: b"/dev/nvidia0\xfe\x1b]0;t\x07"},
               b"/user.slice/\xfe\xffsession.scope"),
        4100: (b"sh\x1b[31m", "S", 1, 4100, {}, "/user.slice/user-1000.slice/session-3.scope"),
    })
