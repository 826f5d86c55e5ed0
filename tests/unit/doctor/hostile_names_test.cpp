// Process names, cgroup paths and fd targets are raw bytes: doctor's JSON must still parse (bytes
// that are not UTF-8 become U+FFFD) and its text must not pass escapes or newlines to a terminal.
#include <gtest/gtest.h>

#include <string>

#include "common/test_support.hpp"
#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {
namespace {

const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD in UTF-8

Report hostile_report() {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/hostile-process-names";
  auto report = collect(options);
  EXPECT_TRUE(report.ok()) << report.status().to_string();
  if (!report.ok()) return {};
  judge(*report);
  return std::move(report).value();
}

TEST(DoctorHostileNames, FixtureHoldsTheRawBytes) {
  Report report = hostile_report();
  ASSERT_EQ(report.processes.processes.size(), 1u);
  const auto& process = report.processes.processes[0];
  EXPECT_EQ(process.comm, "\x1b[2Jev\xffil\nx\xc0\xaf\xc2\x9b");
  EXPECT_EQ(process.parent_comm, "sh\x1b[31m");
  ASSERT_EQ(report.findings.size(), 1u);
  EXPECT_EQ(report.findings[0].id, "gpu.context_leak");
}

TEST(DoctorHostileNames, JsonAlwaysParsesWithReplacementCharacters) {
  Report report = hostile_report();
  std::string text = dump_json(to_json(report));
  auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << "doctor JSON does not parse";
  ASSERT_EQ(parsed["gpu_processes"].size(), 1u);
  const std::string name = parsed["gpu_processes"][0]["name"].get<std::string>();
  // 0xff and the overlong 0xc0 0xaf are replaced; the escape and the C1 control are valid UTF-8
  // and survive as JSON escapes; the ASCII around them is untouched.
  EXPECT_EQ(name, "\x1b[2Jev" + kReplacement + "il\nx" + kReplacement + kReplacement + "\xc2\x9b");
  const std::string cgroup = parsed["gpu_processes"][0]["cgroup"].get<std::string>();
  EXPECT_EQ(cgroup, "/user.slice/" + kReplacement + kReplacement + "session.scope");
  bool replaced_target = false;
  for (const auto& file : parsed["gpu_processes"][0]["gpu_files"]) {
    replaced_target |= file.get<std::string>().find(kReplacement) != std::string::npos;
  }
  EXPECT_TRUE(replaced_target);
  // The raw control bytes never appear unescaped in the JSON text itself.
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
}

TEST(DoctorHostileNames, TextEscapesControlsAndInvalidBytes) {
  Report report = hostile_report();
  for (bool color : {false, true}) {
    std::string text = render_text(report, color);
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto byte = static_cast<unsigned char>(text[i]);
      if (byte == '\n') continue;
      if (byte == 0x1b && color && text.compare(i, 2, "\x1b[") == 0) {
        // Only doctor's own colour codes: ESC [ digits m.
        std::size_t end = text.find('m', i);
        ASSERT_NE(end, std::string::npos);
        EXPECT_EQ(text.substr(i + 2, end - i - 2).find_first_not_of("0123456789;"),
                  std::string::npos)
            << "foreign escape sequence at byte " << i;
        i = end;
        continue;
      }
      ASSERT_GE(byte, 0x20) << "control byte " << int(byte) << " at " << i;
      ASSERT_NE(byte, 0x7f);
      ASSERT_NE(byte, 0xff) << "invalid UTF-8 byte at " << i;
    }
    EXPECT_NE(text.find("\\x1b[2Jev\\xffil\\nx\\xc0\\xaf\\u009b (pid 4242)"), std::string::npos)
        << text;
    EXPECT_NE(text.find("sh\\x1b[31m"), std::string::npos) << text;
    // Each line is one of doctor's: the embedded newline did not start a new one.
    EXPECT_EQ(text.find("\nx"), std::string::npos);
  }
}

}  // namespace
}  // namespace gpuopt::doctor
