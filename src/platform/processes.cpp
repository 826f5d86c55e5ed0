// /proc readers for GPU-holding processes: stat parsing, parent and session checks, fd scan.
#include "gpuopt/platform/processes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <set>

#include "sysfs_text.hpp"

namespace gpuopt::platform {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> read_text(const fs::path& path, std::size_t limit = 8192) {
  return detail::read_text(path, limit);
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::string cgroup_of(const fs::path& proc_dir) {
  auto text = read_text(proc_dir / "cgroup");
  if (!text) return {};
  std::string first;
  std::string_view rest = *text;
  while (!rest.empty()) {
    auto newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    if (line.empty()) continue;
    if (line.substr(0, 3) == "0::") return std::string(line.substr(3));
    if (first.empty()) {
      auto colon = line.find(':', line.find(':') + 1);
      first = std::string(colon == std::string_view::npos ? line : line.substr(colon + 1));
    }
  }
  return first;
}

bool is_gpu_device_path(std::string_view target) {
  return target.substr(0, 12) == "/dev/nvidia" || target.substr(0, 11) == "/dev/nvidia";
}

}  // namespace

std::optional<ProcStat> parse_proc_stat(std::string_view text) {
  auto open = text.find('(');
  auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return std::nullopt;
  }
  ProcStat stat;
  auto pid = parse_int(std::string_view(text.substr(0, open))
                           .substr(0, text.substr(0, open).find_last_not_of(' ') + 1));
  if (!pid) return std::nullopt;
  stat.pid = *pid;
  stat.comm = std::string(text.substr(open + 1, close - open - 1));
  // After ") ": state ppid pgrp session ...
  std::vector<std::string_view> fields;
  std::string_view rest = text.substr(close + 1);
  while (!rest.empty() && fields.size() < 4) {
    // Skip every separator: a field list starting with '\n' once made this loop spin (fuzzer).
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) {
      rest.remove_prefix(1);
    }
    auto space = rest.find_first_of(" \t\n");
    std::string_view field = rest.substr(0, space);
    if (!field.empty()) fields.push_back(field);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space);
  }
  if (fields.size() < 4 || fields[0].size() != 1) return std::nullopt;
  stat.state = fields[0][0];
  auto ppid = parse_int(fields[1]);
  auto session = parse_int(fields[3]);
  if (!ppid || !session) return std::nullopt;
  stat.ppid = *ppid;
  stat.session = *session;
  return stat;
}

bool is_container_cgroup(std::string_view cgroup) {
  for (std::string_view marker : {"docker", "containerd", "kubepods", "libpod", "lxc", "cri-o"}) {
    if (cgroup.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

StatusOr<ProcessInfo> read_process(const std::string& root, int pid) {
  fs::path proc = fs::path(root.empty() ? "/" : root) / "proc";
  fs::path dir = proc / std::to_string(pid);
  auto text = read_text(dir / "stat", 4096);
  if (!text) return not_found(fmt::format("{}/stat is not readable", dir.string()));
  auto stat = parse_proc_stat(*text);
  if (!stat) return data_loss(fmt::format("{}/stat is malformed", dir.string()));
  ProcessInfo info;
  info.pid = pid;
  info.comm = stat->comm;
  info.state = stat->state;
  info.ppid = stat->ppid;
  if (stat->ppid > 0) {
    if (auto parent = read_text(proc / std::to_string(stat->ppid) / "stat", 4096)) {
      if (auto parent_stat = parse_proc_stat(*parent)) {
        info.parent_exists = true;
        info.parent_comm = parent_stat->comm;
      }
    }
  }
  std::error_code error;
  info.session_leader_exists =
      stat->session > 0 && fs::exists(proc / std::to_string(stat->session), error);
  info.cgroup = cgroup_of(dir);
  for (const auto& entry : fs::directory_iterator(dir / "fd", error)) {
    std::error_code link_error;
    fs::path target = fs::read_symlink(entry.path(), link_error);
    if (!link_error && is_gpu_device_path(target.string())) {
      info.gpu_files.push_back(target.string());
    }
  }
  std::sort(info.gpu_files.begin(), info.gpu_files.end());
  info.gpu_files.erase(std::unique(info.gpu_files.begin(), info.gpu_files.end()),
                       info.gpu_files.end());
  return info;
}

GpuProcessScan scan_gpu_processes(const std::string& root, const std::vector<int>& extra_pids) {
  GpuProcessScan scan;
  fs::path proc = fs::path(root.empty() ? "/" : root) / "proc";
  scan.own_cgroup = cgroup_of(proc / "self");
  std::set<int> pids(extra_pids.begin(), extra_pids.end());
  std::set<int> holding;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(proc, error)) {
    auto pid = parse_int(entry.path().filename().string());
    if (!pid) continue;
    std::error_code fd_error;
    fs::directory_iterator fds(entry.path() / "fd", fd_error);
    if (fd_error) {
      ++scan.unreadable;
      continue;
    }
    for (const auto& fd : fds) {
      std::error_code link_error;
      fs::path target = fs::read_symlink(fd.path(), link_error);
      if (!link_error && is_gpu_device_path(target.string())) {
        holding.insert(*pid);
        break;
      }
    }
  }
  pids.insert(holding.begin(), holding.end());
  for (int pid : pids) {
    auto info = read_process(root, pid);
    if (info.ok()) scan.processes.push_back(std::move(info).value());
  }
  return scan;
}

}  // namespace gpuopt::platform
