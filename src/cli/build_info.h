#pragma once
// What this binary was built from: the version (CMakeLists.txt's project version, a compile
// definition) and the commit, stamped at build time (cmake/build_commit.cmake) so that an
// incremental build after a new commit names the new one.
namespace osprey {

// The source tree's short commit at build time, "+dirty" when tracked files had changes, or
// the OSPREY_GIT_COMMIT cache value ("unknown" by default) outside a git checkout.
const char* build_commit();

}  // namespace osprey
