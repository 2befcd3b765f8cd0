// Crash safety of the writers: failures and kills at every stage of a write leave an existing file untouched and
// no partial file at the destination; AtomicFile's contract (temporary name, cleanup, permissions, commit).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

using test_files::list_dir;
using test_files::pattern_bytes;
using test_files::read_file;
using test_files::TempDir;

struct FillFailed : std::runtime_error {
  FillFailed() : std::runtime_error("the data source failed") {}
};

// An existing checkpoint at dir/model.safetensors, returned as its bytes.
std::vector<std::byte> write_old(const TempDir& dir) {
  const std::vector<std::byte> old = pattern_bytes(64, 42);
  const std::vector<SafetensorsEntry> entries = {{"old", SafetensorsDType::U8, {64}, old, {}}};
  write_safetensors(dir / "model.safetensors", entries, {{"version", "old"}});
  return read_file(dir / "model.safetensors");
}

// Three 1 MiB tensors whose `fill` calls `at(index)` before filling: a place to fail or die mid-write.
std::vector<SafetensorsEntry> new_entries(std::function<void(int)> at) {
  std::vector<SafetensorsEntry> entries;
  for (int i = 0; i < 3; ++i) {
    entries.push_back(
        {"t" + std::to_string(i), SafetensorsDType::F32, {1 << 18}, {}, [at, i](std::span<std::byte> out) {
           at(i);
           std::fill(out.begin(), out.end(), std::byte{static_cast<unsigned char>(i + 1)});
         }});
  }
  return entries;
}

TEST(AtomicFile, CommitRenamesTheTemporaryFileIntoPlace) {
  TempDir dir;
  const std::vector<std::byte> bytes = pattern_bytes(1000, 1);
  {
    AtomicFile f(dir / "out.bin");
    EXPECT_EQ(f.temporary_path().parent_path(), dir.path());
    EXPECT_TRUE(f.temporary_path().filename().string().starts_with(".out.bin.tmp-" + std::to_string(::getpid()) + "-"));
    // The name is recognized as one (an output directory holding only such files counts as empty).
    EXPECT_TRUE(is_temporary_file_name(f.temporary_path().filename().string()));
    for (const char* other : {"out.bin", ".out.bin", ".out.bin.tmp-", ".out.bin.tmp-12", ".out.bin.tmp-12-x",
                              "out.bin.tmp-1-2", ".tmp-1-2"}) {
      EXPECT_FALSE(is_temporary_file_name(other)) << other;
    }
    f.write(std::span(bytes).first(10));
    f.write(std::span(bytes).subspan(10));
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{f.temporary_path().filename().string()});
    f.commit();
    EXPECT_TRUE(f.committed());
    EXPECT_THROW(f.write(bytes), Error);
  }
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(read_file(dir / "out.bin"), bytes);
}

// A name the file system takes (up to 255 bytes) has temporaries it takes too: ".<name>.tmp-<pid>-<n>" went past
// NAME_MAX from 235 bytes on, so a long output name could not be written. Long names are cut and hashed.
TEST(AtomicFile, LongNamesHaveTemporaryNamesTheFileSystemTakes) {
  TempDir dir;
  for (const std::string& name : {std::string(240, 'a') + ".safetensors", std::string(250, 'b') + "\xc3\xa9"}) {
    AtomicFile f(dir / name);
    const std::string temporary = f.temporary_path().filename().string();
    EXPECT_LE(temporary.size(), 240u);
    EXPECT_TRUE(is_temporary_file_name(temporary)) << temporary;
    f.write(pattern_bytes(8, 4));
    f.commit();
    EXPECT_EQ(read_file(dir / name), pattern_bytes(8, 4));
  }
  // Two long names that share their first 200 bytes do not share their temporaries.
  AtomicFile a(dir / (std::string(220, 'c') + "1")), b(dir / (std::string(220, 'c') + "2"));
  const std::string ta = a.temporary_path().filename().string(), tb = b.temporary_path().filename().string();
  EXPECT_NE(ta.substr(0, ta.find(".tmp-")), tb.substr(0, tb.find(".tmp-")));
}

TEST(AtomicFile, WithoutCommitNothingChanges) {
  TempDir dir;
  test_files::write_text(dir / "out.bin", "old");
  {
    AtomicFile f(dir / "out.bin");
    f.write(pattern_bytes(100, 2));
    f.sync();
  }
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.bin"});
  const auto old = read_file(dir / "out.bin");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(old.data()), old.size()), "old");
}

TEST(AtomicFile, KeepsThePermissionsOfTheFileItReplaces) {
  TempDir dir;
  test_files::write_text(dir / "out.bin", "old");
  ASSERT_EQ(::chmod((dir / "out.bin").c_str(), 0640), 0);
  AtomicFile f(dir / "out.bin");
  f.write(pattern_bytes(8, 3));
  f.commit();
  struct stat st {};
  ASSERT_EQ(::stat((dir / "out.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST(AtomicFile, FailuresAreIoErrorsNamingThePath) {
  TempDir dir;
  try {
    AtomicFile f(dir / "missing" / "out.bin");
    ADD_FAILURE() << "created a file in a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("cannot create a temporary file in '" + (dir / "missing").string()),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
}

// The rename replaces what is at the destination: a pipe or a device there is refused, not turned into a regular
// file (saving a checkpoint to /dev/null as root replaced the device node).
TEST(AtomicFile, RefusesToReplaceAPipeOrADevice) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  for (const std::filesystem::path& p : {dir / "pipe", std::filesystem::path("/dev/null"), dir.path()}) {
    try {
      AtomicFile f(p);
      ADD_FAILURE() << "would replace " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();  // AtomicFile's every failure
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::is_fifo(dir / "pipe"));
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
}

TEST(SafetensorsCrashSafety, AFailingDataSourceLeavesTheOldFileAndNoTemporary) {
  for (int failing = 0; failing < 3; ++failing) {
    SCOPED_TRACE(failing);
    TempDir dir;
    const std::vector<std::byte> old = write_old(dir);
    const auto entries = new_entries([failing](int i) {
      if (i == failing) throw FillFailed();
    });
    EXPECT_THROW(write_safetensors(dir / "model.safetensors", entries), FillFailed);  // propagated unchanged
    EXPECT_EQ(read_file(dir / "model.safetensors"), old);
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.safetensors"});
    EXPECT_EQ(SafetensorsFile::open(dir / "model.safetensors").metadata().at("version"), "old");
  }
}

TEST(SafetensorsCrashSafety, AFailedRenameLeavesNoTemporary) {
  TempDir dir;
  // rename(2) cannot replace a directory by a file: refused before anything is written (AtomicFile checks what is
  // at the destination), with no temporary left behind.
  std::filesystem::create_directory(dir / "model.safetensors");
  test_files::write_text(dir / "model.safetensors" / "keep", "x");
  const std::vector<std::byte> four = pattern_bytes(4, 1);
  const std::vector<SafetensorsEntry> entries = {{"a", SafetensorsDType::F32, {1}, four, {}}};
  try {
    write_safetensors(dir / "model.safetensors", entries);
    ADD_FAILURE() << "renamed a file over a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("(the destination was not touched)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(list_dir(dir / "model.safetensors"), std::vector<std::string>{"keep"});
}

TEST(SafetensorsCrashSafety, AWriteRefusedByTheOsLeavesTheOldFile) {
  // A child process whose file size limit (RLIMIT_FSIZE) is smaller than the new file: write(2) fails with EFBIG
  // partway through, as it would with ENOSPC on a full disk.
  TempDir dir;
  const std::vector<std::byte> old = write_old(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit limit = {1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int status = 10;
    try {
      write_safetensors(dir / "model.safetensors", new_entries([](int) {}));
      status = 11;  // the write should have failed
    } catch (const Error& e) {
      const bool specific =
          e.kind() == ErrorKind::kIo && std::string(e.what()).find("File too large") != std::string::npos;
      status = !specific ? 12 : list_dir(dir.path()) != std::vector<std::string>{"model.safetensors"} ? 13 : 0;
    } catch (...) {
      status = 14;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: not refused, 12: not a kIo 'File too large', 13: temporary left behind";
  EXPECT_EQ(read_file(dir / "model.safetensors"), old);
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(SafetensorsCrashSafety, AProcessKilledMidWriteLeavesTheOldFile) {
  // SIGKILL before the first tensor, between tensors and before the last (no handler runs, nothing is cleaned up):
  // the destination still holds the old file, complete; only the temporary file is left, under its own name.
  for (int kill_at = 0; kill_at < 3; ++kill_at) {
    SCOPED_TRACE(kill_at);
    TempDir dir;
    const std::vector<std::byte> old = write_old(dir);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      write_safetensors(dir / "model.safetensors", new_entries([kill_at](int i) {
                          if (i == kill_at) ::raise(SIGKILL);
                        }));
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_EQ(read_file(dir / "model.safetensors"), old);
    EXPECT_NO_THROW((void)SafetensorsFile::open(dir / "model.safetensors"));
    const std::string leftover = ".model.safetensors.tmp-" + std::to_string(child) + "-";
    const auto names = list_dir(dir.path());
    ASSERT_EQ(names.size(), 2u);
    EXPECT_TRUE(names[0].starts_with(leftover)) << names[0];
    EXPECT_EQ(names[1], "model.safetensors");
  }
}

// What a killed writer left behind is removed by the next write of the same destination; a live writer's temporary
// file (locked) is not, and neither are other destinations' temporaries.
TEST(SafetensorsCrashSafety, TheNextWriteRemovesWhatAKilledWriterLeft) {
  TempDir dir;
  const std::vector<std::byte> old = write_old(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    write_safetensors(dir / "model.safetensors", new_entries([](int i) {
                        if (i == 1) ::raise(SIGKILL);
                      }));
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(list_dir(dir.path()).size(), 2u);  // the old file and the killed writer's temporary file
  {
    std::ofstream other(dir / ".other.safetensors.tmp-1-0");  // another destination's: not ours to remove
  }
  AtomicFile live(dir / "model.safetensors");  // a writer in progress: its temporary file is locked
  const std::vector<std::byte> bytes = pattern_bytes(100, 3);
  {
    AtomicFile next(dir / "model.safetensors");
    next.write(bytes);
    next.commit();
  }
  const auto names = list_dir(dir.path());
  ASSERT_EQ(names.size(), 3u) << names.size();
  EXPECT_EQ(names[0], live.temporary_path().filename().string());
  EXPECT_EQ(names[1], ".other.safetensors.tmp-1-0");
  EXPECT_EQ(names[2], "model.safetensors");
  EXPECT_EQ(read_file(dir / "model.safetensors"), bytes);
}

TEST(SafetensorsCrashSafety, WritingOverAMappedFileKeepsTheReadersBytes) {
  // safetensors#762: saving over a file that is still mapped truncated it under the reader (zero-filled output).
  // Here the new file is built from the mapped one and renamed over it; the mapping keeps the old bytes.
  TempDir dir;
  const std::vector<std::byte> a = pattern_bytes(1 << 16, 7);
  const std::vector<SafetensorsEntry> first = {{"a", SafetensorsDType::U8, {1 << 16}, a, {}}};
  write_safetensors(dir / "model.safetensors", first);
  const SafetensorsFile mapped = SafetensorsFile::open(dir / "model.safetensors");
  const std::vector<std::byte> b = pattern_bytes(100, 8);
  const std::vector<SafetensorsEntry> second = {safetensors_entry(mapped.at("a")),
                                                {"b", SafetensorsDType::U8, {100}, b, {}}};
  write_safetensors(dir / "model.safetensors", second);
  EXPECT_TRUE(std::ranges::equal(mapped.at("a").bytes, a));  // the reader's view is intact
  const SafetensorsFile updated = SafetensorsFile::open(dir / "model.safetensors");
  EXPECT_TRUE(std::ranges::equal(updated.at("a").bytes, a));
  EXPECT_TRUE(std::ranges::equal(updated.at("b").bytes, b));
}

}  // namespace
}  // namespace fp8kit
