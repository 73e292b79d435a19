// The runtime-state store (server/runtime_state.h): round trips, reopening from the file, the
// file's format and mode, files it must refuse (naming the path), bounds errors naming the field,
// a failed write that leaves memory unchanged, the memory-only store, and the scoped handle.
#include "server/runtime_state.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <algorithm>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sluice::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class RuntimeStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "sluice-runtime-state-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "state.json").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<RuntimeStateStore> open_ok(const std::string& path) {
    auto store = RuntimeStateStore::open(path);
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? std::move(store.value()) : nullptr;
  }
  void write_file(const std::string& text) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << text;
  }
  std::string read_file() const {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  ino_t inode() const {
    struct stat st {};
    EXPECT_EQ(::stat(path_.c_str(), &st), 0);
    return st.st_ino;
  }

  fs::path dir_;
  std::string path_;
};

json value_of(const StatusOr<std::optional<json>>& got) {
  EXPECT_TRUE(got.ok()) << got.status().to_string();
  if (!got.ok() || !got.value().has_value()) return json();
  return *got.value();
}

bool absent(const StatusOr<std::optional<json>>& got) {
  return got.ok() && !got.value().has_value();
}

TEST_F(RuntimeStateStoreTest, PutGetEraseRoundTrip) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->path(), path_);
  EXPECT_TRUE(absent(store->get("throttler", "app-a")));

  const json rule = {{"ratio", 0.25}, {"expires_at", "2026-01-01T00:00:00Z"}};
  ASSERT_TRUE(store->put("throttler", "app-a", rule).ok());
  ASSERT_TRUE(store->put("throttler", "app-b", 7).ok());
  ASSERT_TRUE(store->put("other", "app-a", "x").ok());
  EXPECT_EQ(value_of(store->get("throttler", "app-a")), rule);
  EXPECT_EQ(value_of(store->get("other", "app-a")), "x");

  ASSERT_TRUE(store->put("throttler", "app-b", 8).ok());  // replaces
  EXPECT_EQ(value_of(store->get("throttler", "app-b")), 8);
  EXPECT_EQ(store->list("throttler"), (std::map<std::string, json>{{"app-a", rule}, {"app-b", 8}}));

  ASSERT_TRUE(store->erase("throttler", "app-a").ok());
  EXPECT_TRUE(absent(store->get("throttler", "app-a")));
  EXPECT_TRUE(store->erase("throttler", "app-a").ok());  // idempotent
  EXPECT_TRUE(store->erase("nowhere", "app-a").ok());

  ASSERT_TRUE(store->erase_scope("throttler").ok());
  EXPECT_TRUE(store->list("throttler").empty());
  EXPECT_TRUE(store->erase_scope("throttler").ok());
  EXPECT_EQ(value_of(store->get("other", "app-a")), "x");
}

TEST_F(RuntimeStateStoreTest, ReopenSeesTheSameState) {
  {
    auto store = open_ok(path_);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->put("throttler", "app-a", {{"ratio", 0.5}}).ok());
    ASSERT_TRUE(store->put("throttler", "app-b", json::array({1, 2, 3})).ok());
    ASSERT_TRUE(store->put("throttler", "gone", true).ok());
    ASSERT_TRUE(store->erase("throttler", "gone").ok());
    ASSERT_TRUE(store->put("limits", "k", 1.5e300).ok());
    ASSERT_TRUE(store->put("caf\xc3\xa9", "\xe2\x82\xac", "unicode names").ok());
  }
  auto again = open_ok(path_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->list("throttler"),
            (std::map<std::string, json>{{"app-a", {{"ratio", 0.5}}},
                                         {"app-b", json::array({1, 2, 3})}}));
  EXPECT_EQ(value_of(again->get("limits", "k")), 1.5e300);
  EXPECT_EQ(value_of(again->get("caf\xc3\xa9", "\xe2\x82\xac")), "unicode names");
}

TEST_F(RuntimeStateStoreTest, WritesOneVersionedJsonObjectWithMode0600) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  const mode_t umask_was = ::umask(0);  // the store's own 0600, not the umask's doing
  const Status put = store->put("throttler", "app-a", 1);
  ::umask(umask_was);
  ASSERT_TRUE(put.ok()) << put.to_string();
  ASSERT_TRUE(store->put("empty-soon", "k", 2).ok());
  ASSERT_TRUE(store->erase("empty-soon", "k").ok());  // a scope with no keys is dropped

  EXPECT_EQ(json::parse(read_file()),
            json({{"version", 1}, {"scopes", {{"throttler", {{"app-a", 1}}}}}}));
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // No temp file is left beside it: only its lock file (one store per file).
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"state.json", "state.json.lock"}));
}

TEST_F(RuntimeStateStoreTest, WritesOnlyWhenSomethingChanges) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->put("s", "k", 1).ok());
  const ino_t first = inode();  // each write renames a new file over the path
  ASSERT_TRUE(store->put("s", "k", 1).ok());
  ASSERT_TRUE(store->erase("s", "absent").ok());
  ASSERT_TRUE(store->erase_scope("absent").ok());
  EXPECT_EQ(inode(), first);
  ASSERT_TRUE(store->put("s", "k", 2).ok());
  EXPECT_NE(inode(), first);
}

TEST_F(RuntimeStateStoreTest, AMissingFileIsAnEmptyStoreAndOpenWritesNothing) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->list("throttler").empty());
  EXPECT_FALSE(fs::exists(path_));
}

TEST_F(RuntimeStateStoreTest, AMissingOrNonDirectoryParentIsAnErrorNamingThePath) {
  const std::string missing = (dir_ / "no-such-dir" / "state.json").string();
  auto a = RuntimeStateStore::open(missing);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(missing), std::string::npos) << a.status().to_string();

  write_file("{}");
  const std::string under_file = path_ + "/state.json";  // its parent is a regular file
  auto b = RuntimeStateStore::open(under_file);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(under_file), std::string::npos) << b.status().to_string();
  EXPECT_NE(b.status().message().find("Not a directory"), std::string::npos)
      << b.status().to_string();
}

TEST_F(RuntimeStateStoreTest, AFileItDidNotWriteIsAnErrorNamingThePathAndIsKept) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "is not JSON"},
      {"{\"version\": 1, \"scopes\": {", "is not JSON"},
      {"[1, 2]", "is not a JSON object"},
      {"{\"scopes\": {}}", "has no \"version\""},
      {"{\"version\": 2, \"scopes\": {}}", "is version 2; this build reads version 1"},
      {"{\"version\": \"1\", \"scopes\": {}}", "is version \"1\""},
      {"{\"version\": 1}", "has no \"scopes\" object"},
      {"{\"version\": 1, \"scopes\": []}", "has no \"scopes\" object"},
      {"{\"version\": 1, \"scopes\": {}, \"rules\": {}}", "has an unknown field \"rules\""},
      {"{\"version\": 1, \"scopes\": {\"t\": 5}}", "scopes[\"t\"]: is not an object"},
      {"{\"version\": 1, \"scopes\": {\"t\": {\"" + std::string(300, 'k') + "\": 1}}}",
       "key: is 300 bytes; at most 256"},
      {"{\"version\": 1, \"scopes\": {\"\": {\"k\": 1}}}", "scope: is empty"},
  };
  for (const auto& [text, why] : cases) {
    SCOPED_TRACE(text.substr(0, 80));
    write_file(text);
    auto store = RuntimeStateStore::open(path_);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
    const std::string message = store.status().message();
    EXPECT_EQ(message.rfind(path_ + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_EQ(read_file(), text);  // the user's file is left as it was
  }

  fs::remove(path_);
  fs::create_directory(path_);
  auto dir = RuntimeStateStore::open(path_);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find(path_), std::string::npos);
}

TEST_F(RuntimeStateStoreTest, BoundsErrorsNameTheField) {
  auto store = open_ok("");
  ASSERT_TRUE(store);
  auto message = [](const Status& s) { return s.message(); };
  EXPECT_EQ(message(store->put("", "k", 1)), "scope: is empty");
  EXPECT_EQ(message(store->put("s", "", 1)), "key: is empty");
  EXPECT_EQ(message(store->put(std::string(257, 's'), "k", 1)), "scope: is 257 bytes; at most 256");
  EXPECT_EQ(message(store->put("s", std::string(300, 'k'), 1)), "key: is 300 bytes; at most 256");
  EXPECT_EQ(message(store->put("s", "\xff\xfe", 1)), "key: is not valid UTF-8");
  EXPECT_EQ(message(store->put("s", "k", std::string(70000, 'v'))),
            "value: serializes to 70002 bytes; at most 65536");
  EXPECT_EQ(message(store->put("s", "k", {{"bad", "\xc3"}})),
            "value: holds a string that is not valid UTF-8");
  EXPECT_EQ(message(store->put("s", "k", std::numeric_limits<double>::quiet_NaN())),
            "value: does not read back as itself (NaN, infinity or binary data)");
  EXPECT_EQ(message(store->put("s", "k", json::binary({1, 2}))),
            "value: does not read back as itself (NaN, infinity or binary data)");
  EXPECT_EQ(store->put("s", "k", 1).code(), StatusCode::kOk);
  EXPECT_EQ(store->get("s", std::string(257, 'k')).status().message(),
            "key: is 257 bytes; at most 256");
  EXPECT_EQ(store->erase("", "k").message(), "scope: is empty");
  EXPECT_EQ(store->erase_scope("").code(), StatusCode::kInvalidArgument);
  // Exactly at the bounds is fine.
  EXPECT_TRUE(store->put(std::string(256, 's'), std::string(256, 'k'), 1).ok());
  EXPECT_TRUE(store->put("s", "big", std::string(65534, 'v')).ok());
  // Nothing refused was stored.
  EXPECT_EQ(store->list("s").size(), 2u);
}

TEST_F(RuntimeStateStoreTest, AFullScopeRefusesNewKeysButStillReplaces) {
  auto store = open_ok("");
  ASSERT_TRUE(store);
  for (std::size_t i = 0; i < RuntimeStateStore::kMaxKeysPerScope; ++i) {
    ASSERT_TRUE(store->put("s", "k" + std::to_string(i), 1).ok());
  }
  const Status full = store->put("s", "one-more", 1);
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(full.message(), "scope: holds 10000 keys; at most 10000");
  EXPECT_TRUE(store->put("s", "k0", 2).ok());
  EXPECT_TRUE(store->put("another", "one-more", 1).ok());
  ASSERT_TRUE(store->erase("s", "k1").ok());
  EXPECT_TRUE(store->put("s", "one-more", 1).ok());
}

TEST_F(RuntimeStateStoreTest, AFailedWriteLeavesMemoryAsItWas) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->put("s", "kept", 1).ok());
  ASSERT_TRUE(store->put("lone", "only", 2).ok());
  const std::string before = read_file();

  // The directory is replaced by a regular file: every write now fails (root included).
  const fs::path moved = dir_.string() + ".moved";
  fs::rename(dir_, moved);
  std::ofstream(dir_.string()) << "not a directory";

  const Status add = store->put("s", "new", 3);
  EXPECT_EQ(add.code(), StatusCode::kUnavailable);
  EXPECT_NE(add.message().find(path_), std::string::npos) << add.message();
  EXPECT_NE(add.message().find("Not a directory"), std::string::npos) << add.message();
  EXPECT_FALSE(store->put("new-scope", "k", 3).ok());
  EXPECT_FALSE(store->put("s", "kept", 4).ok());
  EXPECT_FALSE(store->erase("s", "kept").ok());
  EXPECT_FALSE(store->erase("lone", "only").ok());  // would drop the scope
  EXPECT_FALSE(store->erase_scope("s").ok());

  EXPECT_EQ(store->list("s"), (std::map<std::string, json>{{"kept", 1}}));
  EXPECT_EQ(store->list("lone"), (std::map<std::string, json>{{"only", 2}}));
  EXPECT_TRUE(store->list("new-scope").empty());

  fs::remove(dir_);
  fs::rename(moved, dir_);
  EXPECT_EQ(read_file(), before);
  ASSERT_TRUE(store->put("s", "new", 3).ok());  // writes work again, from memory
  store.reset();                                // (one store per file at a time)
  auto again = open_ok(path_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->list("s"), (std::map<std::string, json>{{"kept", 1}, {"new", 3}}));
  EXPECT_EQ(again->list("lone"), (std::map<std::string, json>{{"only", 2}}));
}

TEST_F(RuntimeStateStoreTest, AnEmptyPathKeepsEverythingInMemory) {
  auto store = open_ok("");
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->path().empty());
  ASSERT_TRUE(store->put("s", "k", {{"a", 1}}).ok());
  EXPECT_EQ(value_of(store->get("s", "k")), json({{"a", 1}}));
  ASSERT_TRUE(store->erase("s", "k").ok());
  EXPECT_TRUE(absent(store->get("s", "k")));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(RuntimeStateStoreTest, ConcurrentPutsAllLandInTheFile) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 5; ++i) {
        EXPECT_TRUE(store->put("s", std::to_string(t) + "-" + std::to_string(i), i).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto listed = store->list("s");
  store.reset();  // one store per file at a time
  auto again = open_ok(path_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->list("s").size(), 20u);
  EXPECT_EQ(again->list("s"), listed);
}

TEST(RuntimeState, AHandleSeesOnlyItsOwnScope) {
  auto opened = RuntimeStateStore::open("");
  ASSERT_TRUE(opened.ok());
  std::shared_ptr<RuntimeStateStore> store = std::move(opened.value());
  RuntimeState mine(store, "throttler-a");
  RuntimeState theirs(store, "throttler-b");
  EXPECT_EQ(mine.scope(), "throttler-a");

  ASSERT_TRUE(mine.put("app", 1).ok());
  ASSERT_TRUE(theirs.put("app", 2).ok());
  EXPECT_EQ(*mine.get("app").value(), 1);
  EXPECT_EQ(*theirs.get("app").value(), 2);
  EXPECT_EQ(*store->get("throttler-a", "app").value(), 1);
  EXPECT_EQ(mine.list(), (std::map<std::string, json>{{"app", 1}}));

  ASSERT_TRUE(mine.erase("app").ok());
  EXPECT_FALSE(mine.get("app").value().has_value());
  EXPECT_EQ(*theirs.get("app").value(), 2);
  EXPECT_EQ(mine.put("", 1).message(), "key: is empty");
}

// A burst of changes made without waiting: each is seen at once, each is answered once the
// file holds it, and they share writes (far fewer than one each).
TEST_F(RuntimeStateStoreTest, ChangesMadeWithoutWaitingAreSeenAtOnceAndShareWrites) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  constexpr int kChanges = 200;
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0, failed = 0;
  const auto done = [&](Status s) {
    const std::lock_guard<std::mutex> lock(mu);
    ++answered;
    failed += s.ok() ? 0 : 1;
    cv.notify_all();
  };
  for (int i = 0; i < kChanges; ++i) {
    store->put_async("s", "k" + std::to_string(i), i, done);
    EXPECT_EQ(value_of(store->get("s", "k" + std::to_string(i))), i);  // seen at once
  }
  store->erase_async("s", "k0", done);
  EXPECT_TRUE(absent(store->get("s", "k0")));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(10), [&] { return answered == kChanges + 1; }));
  }
  EXPECT_EQ(failed, 0);
  EXPECT_LT(store->writes(), static_cast<std::uint64_t>(kChanges) / 4) << store->writes();
  EXPECT_GE(store->writes(), 1u);
  const auto listed = store->list("s");
  store.reset();
  auto again = open_ok(path_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->list("s"), listed);
  EXPECT_EQ(again->list("s").size(), static_cast<std::size_t>(kChanges - 1));
  // Bad input and a change that changes nothing are answered at once, with no write.
  Status bad;
  again->put_async("", "k", 1, [&](Status s) { bad = std::move(s); });
  EXPECT_EQ(bad.message(), "scope: is empty");
  bool same = false;
  again->put_async("s", "k5", 5, [&](Status s) { same = s.ok(); });
  EXPECT_TRUE(same);
  EXPECT_EQ(again->writes(), 0u);
}

// A failed write takes back every change not yet written and answers each with why.
TEST_F(RuntimeStateStoreTest, AFailedWriteWithoutWaitingTakesEveryUnwrittenChangeBack) {
  auto store = open_ok(path_);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->put("s", "kept", 1).ok());
  const fs::path moved = dir_.string() + ".moved";
  fs::rename(dir_, moved);
  std::ofstream(dir_.string()) << "not a directory";
  OneShot<Status> first, second;
  store->put_async("s", "new", 2, first.setter());
  store->erase_async("s", "kept", second.setter());
  const Status a = first.get(), b = second.get();
  EXPECT_EQ(a.code(), StatusCode::kUnavailable);
  EXPECT_NE(a.message().find("Not a directory"), std::string::npos) << a.message();
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(store->list("s"), (std::map<std::string, json>{{"kept", 1}}));  // as written
  fs::remove(dir_);
  fs::rename(moved, dir_);
}

// Two servers on one state file would each rewrite it from their own rules: the second store is
// refused while the first lives, naming the file; once it is gone, the file opens again.
TEST_F(RuntimeStateStoreTest, AFileAnotherStoreHoldsIsRefusedUntilItIsClosed) {
  auto first = open_ok(path_);
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->put("s", "k", 1).ok());
  auto second = RuntimeStateStore::open(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), path_ + ": in use by another sluice server (it holds " +
                                           path_ +
                                           ".lock); give each server a state file of its own");
  first.reset();
  auto third = open_ok(path_);
  ASSERT_TRUE(third);
  EXPECT_EQ(*third->get("s", "k").value(), 1);
}

}  // namespace
}  // namespace sluice::server
