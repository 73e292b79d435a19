// ui_assets.h: the /ui page's files (src/transport/ui), built into the binary by
// cmake/EmbedFiles.cmake, and how the HTTP API serves them.
#pragma once

#include <span>
#include <string_view>

namespace sluice::transport {

struct EmbeddedFile {
  std::string_view name;  // its path under src/transport/ui: "index.html", "app.js"
  std::string_view body;
};

// Every file of the page.
[[nodiscard]] std::span<const EmbeddedFile> ui_files() noexcept;

// The file a /ui path names ("/ui" and "/ui/" are index.html), or null.
[[nodiscard]] const EmbeddedFile* ui_file(std::string_view path) noexcept;

// Its Content-Type, from its name's extension.
[[nodiscard]] std::string_view ui_content_type(std::string_view name) noexcept;

}  // namespace sluice::transport
