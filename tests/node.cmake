# The suites written for Node.js (included from tests/CMakeLists.txt when the executable is
# built), each against the sluice binary built here, their npm dependencies installed by their
# own script from the exact versions in their package-lock.json:
#   ui.browser   the /ui page in headless Chromium (Debian's chromium, puppeteer-core): every
#                policy of the default config shown, charts moving under load, admin actions
#                only with the token; its screenshot lands in ui.png here. About 10 s.
add_test(NAME ui.browser COMMAND bash ${PROJECT_SOURCE_DIR}/tests/ui/run.sh)
set_tests_properties(ui.browser PROPERTIES
  ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice_cli>;SLUICE_UI_SCREENSHOT=${PROJECT_BINARY_DIR}/ui.png"
  LABELS integration TIMEOUT 180)
#   node.client  the Node client (clients/node: @grpc/grpc-js) and its Express middleware,
#                against real servers its tests start; npm pack's tarball installed outside
#                the checkout; the type declarations compiled. About 15 s.
add_test(NAME node.client
         COMMAND bash -c "{ [ -d node_modules/@grpc/grpc-js ] || npm ci --no-audit --no-fund --loglevel=error; } && npm test"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/clients/node)
set_tests_properties(node.client PROPERTIES
  ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice_cli>"
  LABELS integration TIMEOUT 300)
