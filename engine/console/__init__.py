"""The operator's console: text views of a running client, and the aiomonitor commands showing them."""
