package ops

import (
	"context"

	"github.com/keyline-mq/keyline/broker/console"
	"github.com/keyline-mq/keyline/internal/adminapi"
)

// consoleBackend gives the web console (package console, which knows nothing
// of mochi) what the admin API serves, from the same functions: a page and
// the matching API call always agree.
type consoleBackend struct {
	b      *Service
	groups *groupAdmin
}

var _ console.Backend = (*consoleBackend)(nil)

func (c *consoleBackend) Overview() adminapi.OverviewView { return c.b.overview() }

func (c *consoleBackend) Bridges() []adminapi.BridgeView { return c.b.b.Bridges() }

func (c *consoleBackend) Groups() ([]adminapi.GroupView, error) {
	vs, err := c.groups.groupViews()
	if err != nil {
		return nil, c.groups.statusError(err, "", 0)
	}
	return vs, nil
}

func (c *consoleBackend) Group(name string) (adminapi.GroupView, error) {
	v, err := c.groups.groupDetail(name)
	if err != nil {
		return v, c.groups.statusError(err, name, 0)
	}
	return v, nil
}

func (c *consoleBackend) GroupMessages(ctx context.Context, name string, limit int) (adminapi.GroupMessagesView, error) {
	return c.groups.groupMessages(ctx, name, limit)
}

func (c *consoleBackend) GroupActivity(name string) (adminapi.GroupActivityView, error) {
	return c.groups.groupActivity(name)
}

func (c *consoleBackend) DeleteGroup(ctx context.Context, name, remote string) (adminapi.DeleteGroupResult, error) {
	return c.groups.deleteGroup(ctx, name, remote)
}

func (c *consoleBackend) DeadLetters(name string, after uint64, limit int) (adminapi.DeadLetterPage, error) {
	return c.groups.deadLetterPage(name, after, limit)
}

func (c *consoleBackend) DeadLetter(name string, id uint64) (adminapi.DeadLetterView, error) {
	return c.groups.deadLetter(name, id)
}

func (c *consoleBackend) Replay(ctx context.Context, name string, id uint64, all bool, remote string) (adminapi.ReplayResult, error) {
	return c.groups.replay(ctx, name, id, !all, remote)
}

func (c *consoleBackend) Purge(name string, id uint64, all bool, remote string) (adminapi.PurgeResult, error) {
	return c.groups.purge(name, id, !all, remote)
}

func (c *consoleBackend) Clients() []adminapi.ClientView { return c.b.b.Clients() }

func (c *consoleBackend) Client(id string) (adminapi.ClientDetail, error) {
	return c.b.b.Client(id)
}

func (c *consoleBackend) Disconnect(id, remote string) (adminapi.DisconnectResult, error) {
	return c.b.disconnect(id, remote)
}
