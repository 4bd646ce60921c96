package volfuse

// For the tests' cleanup of fusectl.
var IsMountPointForTest = isMountPoint

const FusectlDirForTest = fusectlDir
