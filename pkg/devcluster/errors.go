package devcluster

import "fmt"

// The error kinds of the package, recognised by errdefs.IsInvalidArgument,
// errdefs.IsNotFound and errdefs.IsAlreadyExists (so shoalctl maps them to
// its exit codes) without changing the message.

type invalidError struct{ error }

func (invalidError) InvalidParameter() {}
func (e invalidError) Unwrap() error   { return e.error }

type notFoundError struct{ error }

func (notFoundError) NotFound()       {}
func (e notFoundError) Unwrap() error { return e.error }

type existsError struct{ error }

func (existsError) AlreadyExists()  {}
func (e existsError) Unwrap() error { return e.error }

func invalidf(format string, args ...any) error {
	return invalidError{fmt.Errorf(format, args...)}
}
