// AtomicDirectory: a directory replaced whole. The new content is staged beside the destination and swapped in at
// commit; what the old directory held and the new one does not goes on (hard links), except what the caller's
// filter refuses; a writer killed before the swap leaves the old directory, and its staging directory is removed by
// the next writer, never a live writer's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

namespace fs = std::filesystem;
using test_files::list_dir;
using test_files::TempDir;
using test_files::write_text;

std::string text_of(const fs::path& path) {
  const std::vector<std::byte> bytes = test_files::read_file(path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A complete file in `dir`, as the writers put one there (AtomicFile, committed).
void put(const fs::path& dir, const std::string& name, const std::string& text) {
  AtomicFile f(dir / name);
  f.write(std::as_bytes(std::span<const char>(text)));
  f.commit();
}

// The swap tests need the temporary directory's file system to exchange directories (RENAME_EXCHANGE: ext4, xfs,
// btrfs, tmpfs); on one that cannot (NFS) AtomicDirectory writes in place and these tests fail, naming the fix.
#define ASSERT_SWAPS(dir)                                                                            \
  ASSERT_FALSE(AtomicDirectory(dir).in_place())                                                      \
      << (dir)                                                                                       \
      << ": written in place, not swapped; run the tests with TMPDIR on a local file system (ext4, " \
         "xfs, btrfs, tmpfs)"

ino_t inode_of(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST(AtomicDirectory, ANewDirectoryAppearsWholeAtCommit) {
  TempDir root;
  const fs::path out = root / "out";
  {
    AtomicDirectory d(out);
    EXPECT_FALSE(d.in_place());
    EXPECT_EQ(d.destination(), out);
    EXPECT_EQ(d.path().parent_path(), root.path());
    EXPECT_TRUE(d.path().filename().string().starts_with(".out.tmp-" + std::to_string(::getpid()) + "-"));
    put(d.path(), "a.txt", "new a");
    fs::create_directory(d.path() / "sub");
    put(d.path() / "sub", "b.txt", "new b");
    EXPECT_FALSE(fs::exists(out));  // nothing there until the commit
    d.commit();
    EXPECT_THROW(d.commit(), Error);
  }
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(text_of(out / "a.txt"), "new a");
  EXPECT_EQ(text_of(out / "sub" / "b.txt"), "new b");
}

TEST(AtomicDirectory, ALongNameIsStagedUnderANameTheFileSystemTakes) {
  TempDir root;
  const fs::path out = root / std::string(250, 'd');
  {
    AtomicDirectory d(out);
    EXPECT_FALSE(d.in_place());
    EXPECT_LE(d.path().filename().string().size(), 240u);
    put(d.path(), "a.txt", "new a");
    d.commit();
  }
  EXPECT_EQ(text_of(out / "a.txt"), "new a");
  ASSERT_SWAPS(out);  // an existing one is swapped too (its probe and old-tree names are the staging's)
  AtomicDirectory again(out);
  put(again.path(), "a.txt", "newer a");
  again.commit();
  EXPECT_EQ(text_of(out / "a.txt"), "newer a");
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{out.filename().string()});
}

TEST(AtomicDirectory, WithoutCommitNothingChanges) {
  TempDir root;
  const fs::path out = root / "out";
  fs::create_directory(out);
  write_text(out / "a.txt", "old a");
  {
    AtomicDirectory d(out);
    put(d.path(), "a.txt", "new a");
    put(d.path(), "c.txt", "new c");
  }
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(list_dir(out), std::vector<std::string>{"a.txt"});
  EXPECT_EQ(text_of(out / "a.txt"), "old a");
  {
    AtomicDirectory d(root / "fresh");  // a destination that was not there stays absent
    put(d.path(), "x", "x");
  }
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
}

// The old directory's other entries go on into the new one (files as hard links of the same inode, folders merged,
// links as links, permission bits kept); what the filter refuses and interrupted writes' temporary files do not.
TEST(AtomicDirectory, ReplacesWhatIsWrittenAndCarriesTheRestOver) {
  TempDir root;
  const fs::path out = root / "out";
  fs::create_directories(out / "sub");
  write_text(out / "model-00001-of-00002.safetensors", "old shard 1");
  write_text(out / "model-00002-of-00002.safetensors", "old shard 2");
  write_text(out / "model.safetensors.index.json", "old index");
  write_text(out / "config.json", "old config");
  write_text(out / "README.md", "the user's notes");
  write_text(out / "sub" / "kept.txt", "kept");
  write_text(out / "sub" / "model.safetensors", "not top-level: kept");
  write_text(out / ".config.json.tmp-12345-0", "half a file");  // an interrupted write's, abandoned
  fs::create_symlink("README.md", out / "link");
  fs::create_symlink("gone", out / "dangling");
  fs::create_directories(out / "model-00009-of-00009.safetensors");  // a folder: not asked of `carry`
  fs::create_directories(out / "readonly");
  write_text(out / "readonly" / "r.txt", "r");
  ASSERT_EQ(::mkfifo((out / "pipe").c_str(), 0600), 0);
  ASSERT_SWAPS(out);
  fs::permissions(out, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  fs::permissions(out / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
  fs::permissions(out / "sub", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  const ino_t readme = inode_of(out / "README.md");
  // A writer with a file open in the directory (a log written through a run): its temporary file goes on, and its
  // commit lands in the new directory.
  AtomicFile live(out / "live.log");
  live.write(std::as_bytes(std::span<const char>(std::string_view("written across the swap"))));
  {
    AtomicDirectory d(out);
    put(d.path(), "model.safetensors", "new weights");
    put(d.path(), "config.json", "new config");
    fs::create_directory(d.path() / "sub");
    put(d.path() / "sub", "new.txt", "new in sub");
    d.commit([](const fs::path& relative) { return kept_beside_new_checkpoint(relative); });
  }
  live.commit();
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(list_dir(out), (std::vector<std::string>{"README.md", "config.json", "dangling", "link", "live.log",
                                                     "model-00009-of-00009.safetensors", "model.safetensors", "pipe",
                                                     "readonly", "sub"}));
  EXPECT_EQ(text_of(out / "live.log"), "written across the swap");
  EXPECT_TRUE(fs::is_symlink(out / "dangling"));
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(out / "pipe")));
  EXPECT_TRUE(fs::is_directory(out / "model-00009-of-00009.safetensors"));
  EXPECT_EQ(text_of(out / "readonly" / "r.txt"), "r");
  EXPECT_EQ(fs::status(out / "readonly").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_EQ(text_of(out / "model.safetensors"), "new weights");
  EXPECT_EQ(text_of(out / "config.json"), "new config");
  EXPECT_EQ(text_of(out / "README.md"), "the user's notes");
  EXPECT_EQ(inode_of(out / "README.md"), readme);  // linked, not copied
  EXPECT_EQ(list_dir(out / "sub"), (std::vector<std::string>{"kept.txt", "model.safetensors", "new.txt"}));
  EXPECT_EQ(text_of(out / "sub" / "kept.txt"), "kept");
  EXPECT_EQ(fs::status(out / "sub").permissions() & fs::perms::all,  // a folder of both keeps the old one's bits
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  EXPECT_TRUE(fs::is_symlink(out / "link"));
  EXPECT_EQ(fs::read_symlink(out / "link"), fs::path("README.md"));
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
}

// A file where the new content has a folder, or a folder where it has a file (a folder named like the weights the
// new content writes): refused, nothing changed, nothing left.
TEST(AtomicDirectory, RefusesToLoseWhatTheUserHadAndChangesNothing) {
  TempDir root;
  const fs::path out = root / "out";
  fs::create_directories(out / "notes");
  fs::create_directories(out / "model.safetensors" / "inside");
  write_text(out / "pooling", "a file");
  ASSERT_SWAPS(out);
  for (const char* clash : {"notes", "pooling", "model.safetensors"}) {
    AtomicDirectory d(out);
    if (std::string(clash) == "pooling") {
      fs::create_directory(d.path() / "pooling");
    } else {
      put(d.path(), clash, "a file where a folder is");
    }
    try {
      d.commit([](const fs::path& relative) { return kept_beside_new_checkpoint(relative); });
      ADD_FAILURE() << clash << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(std::string(e.what()).find((out / clash).string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("in the way"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(list_dir(out), (std::vector<std::string>{"model.safetensors", "notes", "pooling"}));
  EXPECT_EQ(text_of(out / "pooling"), "a file");
  EXPECT_TRUE(fs::is_directory(out / "model.safetensors" / "inside"));
}

// What a swap would change beyond the content is written in place: a directory holding the working directory (the
// process would work in the removed old tree), or a symbolic link to a folder (the new content's folder of that name
// would take the link's place; in place, it is written through). A link to nothing is carried as a link.
TEST(AtomicDirectory, InPlaceWhereTheWorkingDirectoryOrALinkToAFolderIsInside) {
  TempDir root;
  const fs::path out = root / "out";
  fs::create_directories(out / "sub");
  fs::create_symlink("gone", out / "dangling");
  ASSERT_SWAPS(out);
  const fs::path before = fs::current_path();
  fs::current_path(out / "sub");
  const bool in_place = AtomicDirectory(out).in_place();
  fs::current_path(before);
  EXPECT_TRUE(in_place);
  fs::create_directories(root / "elsewhere");
  fs::create_symlink(root / "elsewhere", out / "linked");
  EXPECT_TRUE(AtomicDirectory(out).in_place());
}

// A writer killed before its commit (SIGKILL: nothing cleaned up) leaves the old directory and its staging
// directory; the next writer removes that one, and a tree an exchange left under such a name, but not a live
// writer's staging directory.
TEST(AtomicDirectory, AKilledWritersStagingIsRemovedByTheNextWriterButALiveOnesIsNot) {
  TempDir root;
  const fs::path out = root / "out";
  fs::create_directory(out);
  write_text(out / "a.txt", "old a");
  ASSERT_SWAPS(out);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    AtomicDirectory d(out);
    put(d.path(), "a.txt", "new a");
    ::raise(SIGKILL);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(text_of(out / "a.txt"), "old a");
  EXPECT_EQ(list_dir(root.path()).size(), 2u);                     // out and the dead writer's staging directory
  fs::create_directories(root / ".out.tmp-99999-7" / "old tree");  // what a kill right after an exchange leaves
  {
    AtomicDirectory live(out);
    put(live.path(), "a.txt", "live a");
    EXPECT_EQ(list_dir(root.path()), (std::vector<std::string>{live.path().filename().string(), "out"}));
    AtomicDirectory next(out);
    EXPECT_TRUE(fs::exists(live.path() / "a.txt"));  // a live writer's staging directory is left alone
    put(next.path(), "a.txt", "next a");
    live.commit();
    next.commit();  // the last commit wins
  }
  EXPECT_EQ(list_dir(root.path()), std::vector<std::string>{"out"});
  EXPECT_EQ(list_dir(out), std::vector<std::string>{"a.txt"});
  EXPECT_EQ(text_of(out / "a.txt"), "next a");
}

// Where a swap would change what the path is (a symbolic link to a directory, "."), the content is written in
// place; a destination that is a file, a link to nothing, or in a folder that does not exist is refused.
TEST(AtomicDirectory, InPlaceForALinkAndRefusalsNamingThePath) {
  TempDir root;
  fs::create_directory(root / "real");
  fs::create_symlink(root / "real", root / "link");
  {
    AtomicDirectory d(root / "link");
    EXPECT_TRUE(d.in_place());
    EXPECT_EQ(d.path(), root / "link");
    put(d.path(), "a.txt", "through the link");
    d.commit();
  }
  EXPECT_TRUE(fs::is_symlink(root / "link"));
  EXPECT_EQ(text_of(root / "real" / "a.txt"), "through the link");
  EXPECT_TRUE(AtomicDirectory(root / "real" / ".").in_place());
  EXPECT_EQ(AtomicDirectory(root / "real" / "").destination(), root / "real");  // "real/" is "real"
  write_text(root / "file", "x");
  fs::create_symlink(root / "gone", root / "dangling");
  for (const auto& [path, what] :
       std::vector<std::pair<fs::path, std::string>>{{root / "file", "a file of that name is in the way"},
                                                     {root / "dangling", "a symbolic link to nothing"},
                                                     {root / "missing" / "out", "does not exist"}}) {
    try {
      AtomicDirectory d(path);
      ADD_FAILURE() << path << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(list_dir(root.path()), (std::vector<std::string>{"dangling", "file", "link", "real"}));
}

}  // namespace
}  // namespace fp8kit
