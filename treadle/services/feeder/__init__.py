"""The feeder: submits each dataset task's rows to the scheduler, epoch by epoch, from a durable position."""
