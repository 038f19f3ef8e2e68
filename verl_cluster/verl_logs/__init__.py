"""Reading verl's logs: steps and phase times, lengths, the ETA, what a failure's last lines say."""
