online
