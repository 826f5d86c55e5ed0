// Processes that hold an NVIDIA GPU, read from /proc under a root: state, parent, session and
// cgroup, so doctor can name leaked contexts (zombies, orphans, other containers).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::platform {

struct ProcStat {
  int pid = 0;
  std::string comm;
  char state = '?';  // R S D Z T ...
  int ppid = 0;
  int session = 0;
};

// /proc/<pid>/stat: "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')'.
std::optional<ProcStat> parse_proc_stat(std::string_view text);

struct ProcessInfo {
  int pid = 0;
  std::string comm;
  char state = '?';
  int ppid = 0;
  std::string parent_comm;  // empty when the parent is gone
  bool parent_exists = false;
  bool session_leader_exists = false;
  std::string cgroup;                  // the unified (0::) path or the first line
  std::vector<std::string> gpu_files;  // /dev/nvidia* the process has open (when readable)
};

// Reads one process; NOT_FOUND when <root>/proc/<pid> is absent.
StatusOr<ProcessInfo> read_process(const std::string& root, int pid);

struct GpuProcessScan {
  std::vector<ProcessInfo> processes;  // holding /dev/nvidia* (fd scan), pid order
  int unreadable = 0;                  // processes whose fd table we may not read (not root)
  std::string own_cgroup;              // <root>/proc/self/cgroup
};

// Scans <root>/proc/*/fd for /dev/nvidia* (nvidia0..N, nvidiactl, nvidia-uvm). Extra pids (from
// NVML's process list) are added even when their fds are not readable.
GpuProcessScan scan_gpu_processes(const std::string& root, const std::vector<int>& extra_pids = {});

// True when the cgroup path names a container runtime (docker, containerd, kubepods, libpod, lxc).
bool is_container_cgroup(std::string_view cgroup);

}  // namespace gpuopt::platform
